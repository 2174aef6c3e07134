"""`laneway epp --kubernetes` against a real API server as the chart's picker runs it: with
the gateway's ServiceAccount (the chart's picker Deployment uses it), it lists and watches
the release's InferencePools, unrefused by RBAC, and follows a pool that appears and goes.
tests/test_epp_envoy.py routes through a watching picker behind Envoy (a scripted API
server); this is the real one's RBAC and watch."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.kube.cluster import Cluster
from support.kube.laneway import Laneway, released
from support.kube.processes import eventually, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

POOL = {
    "apiVersion": "laneway.io/v1alpha1",
    "kind": "InferencePool",
    "metadata": {"name": "picked"},
    "spec": {"lane": "interactive", "model": "picked", "engine": {"kind": "simulator"}},
}


def known_pools(metrics: str) -> set[str]:
    """The pools the picker's /metrics names (every pool it knows has a queue depth)."""
    try:
        with urllib.request.urlopen(f"{metrics}/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return set()
    return {
        sample.labels["pool"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "laneway_gateway_queue_depth"
    }


def test_the_picker_watches_pools_as_the_gateways_account(kube: Cluster) -> None:
    with released(kube, "lwpk", "lw-picker") as release:
        namespace = release.namespace
        account = kube.service_account_kubeconfig(namespace, release.service_accounts["gateway"])
        metrics = free_port()
        picker = Laneway(
            [
                "epp", "--kubernetes", "--namespace", namespace, "--host", "127.0.0.1",
                "--port", str(free_port()), "--metrics-port", str(metrics),
            ],
            account,
            kube.log_path("picker"),
        )  # fmt: skip
        url = f"http://127.0.0.1:{metrics}"
        picker.start()
        try:
            kube.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(POOL))
            eventually("the picker to see the pool", lambda: "picked" in known_pools(url))
            kube.kubectl("delete", "lwpool", "picked", "-n", namespace)
            eventually("the picker to drop the pool", lambda: "picked" not in known_pools(url))
            assert picker.running(), picker.output()
        finally:
            picker.stop()
        assert "Forbidden" not in picker.output(), f"RBAC refused:\n{picker.output()}"
