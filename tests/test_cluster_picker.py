"""`laneway epp --kubernetes` against a real API server as the chart's picker runs it: with
the gateway's ServiceAccount (the chart's picker Deployment uses it), it lists and watches
the release's InferencePools, unrefused by RBAC, and follows a pool that appears and goes.
Then the chart's picker mode with `picker.watchObjectives`, installed by helm (its RBAC as
rendered): the picker runs with the rendered arguments as the Deployment's account, which
may do exactly what the picker reads and no more; it discovers a priority-scheduled pool's
endpoint, and an InferenceObjective applied, changed, added and deleted moves the priority
it sends the engine. tests/test_epp_envoy.py routes through a watching picker behind Envoy
(a scripted API server); this is the real one's RBAC and watch."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from prometheus_client.parser import text_string_to_metric_families
from support.epp import destination, request_body, request_headers
from support.kube.cluster import Cluster
from support.kube.laneway import Laneway, released
from support.kube.processes import eventually, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

READY_TIMEOUT_S = 180.0  # patience on a loaded machine, not a budget

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


# --- the picker mode's account and RBAC, with --watch-objectives ---------------------------

PICKER_MODE = (
    "--set", "picker.enabled=true",
    "--set", "picker.watchObjectives=true",
    # Its example HTTPRoute needs the Gateway API's CRDs, which are not what is tested here.
    "--set", "picker.httpRoute.enabled=false",
    "--set", "gateway.auth.enabled=false",
)  # fmt: skip
RANKED = "ranked"  # the priority-scheduled pool the picker discovers
# What `laneway epp --kubernetes --watch-objectives` reads, and all the account may do
# beyond what every authenticated user may (discovery, reviews of itself).
PICKER_CALLS = {
    (group, resource, verb)
    for group, resource in (
        ("laneway.io", "inferencepools"),
        ("discovery.k8s.io", "endpointslices"),
        ("inference.networking.x-k8s.io", "inferenceobjectives"),
    )
    for verb in ("list", "watch")
}
SELF_REVIEWS = {"authorization.k8s.io", "authentication.k8s.io"}


def ranked_pool(port: int, address: str) -> list[dict[str, Any]]:
    """A priority-scheduled pool and its endpoint, written by hand (no operator runs here):
    a Service without a selector and its EndpointSlice naming `address:port`, labelled with
    its pool as the EndpointSlice controller labels the operator's."""
    return [
        {
            "apiVersion": "laneway.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": RANKED},
            "spec": {
                "lane": "interactive",
                "model": RANKED,
                "engine": {"kind": "simulator"},
                "scheduling": {"policy": "priority"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": RANKED},
            "spec": {"ports": [{"name": "http", "port": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{RANKED}-by-hand",
                "labels": {
                    "kubernetes.io/service-name": RANKED,
                    "laneway.io/pool": RANKED,
                    "endpointslice.kubernetes.io/managed-by": "laneway-tests",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
    ]


def objective(name: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": RANKED}, "priority": priority},
    }


@dataclass(frozen=True)
class Routed:
    destination: str
    priority: int | None  # the engine body's priority (vLLM's: lower earlier)


def route(target: str, objective_name: str) -> Routed | None:
    """One chat request through the picker at `target`, the test in Envoy's place, naming
    `objective_name`; None while it does not route (not listening, no endpoint yet)."""
    body = json.dumps(
        {"model": RANKED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    messages = [
        request_headers(extra={"x-gateway-inference-objective": objective_name}),
        request_body(body),
    ]
    with grpc.insecure_channel(target) as channel:
        try:
            answers = list(ExternalProcessorStub(channel).Process(iter(messages), timeout=30))
        except grpc.RpcError:
            return None
    if len(answers) != 2 or answers[0].HasField("immediate_response"):
        return None
    sent = answers[1].request_body.response.body_mutation.streamed_response.body
    return Routed(destination(answers[0]), json.loads(sent).get("priority"))


def account_rules(kube: Cluster, namespace: str, account: Path) -> set[tuple[str, str, str]]:
    """What the API server lets `account` do in `namespace` (SelfSubjectRulesReview, asked
    as the account), without what it lets every authenticated user do."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    # Unvalidated: validating asks for the CRDs, which the account may not list.
    create = ("create", "--validate=false", "-f", "-", "-o", "json")
    out = kube.kubectl(*create, stdin=json.dumps(review), kubeconfig=account).stdout
    return {
        (group, resource, verb)
        for rule in json.loads(out)["status"]["resourceRules"]
        for group in rule.get("apiGroups", [])
        if group not in SELF_REVIEWS
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


def picker_account(kube: Cluster, namespace: str) -> str:
    """The ServiceAccount the chart's picker Deployment runs as."""
    (deployment,) = kube.get(
        "deployments", "-n", namespace, "-l", "app.kubernetes.io/component=picker"
    )["items"]
    return str(deployment["spec"]["template"]["spec"]["serviceAccountName"])


def picker_args(kube: Cluster, namespace: str, config: Path) -> list[str]:
    """The chart's picker arguments as rendered, with its ConfigMap's settings file at
    `config` and its ports on this machine's loopback."""
    (deployment,) = kube.get(
        "deployments", "-n", namespace, "-l", "app.kubernetes.io/component=picker"
    )["items"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (configmap,) = kube.get(
        "configmaps", "-n", namespace, "-l", "app.kubernetes.io/component=picker"
    )["items"]
    config.write_text(configmap["data"]["picker.yaml"])
    args = list(container["args"])
    args[args.index("--config") + 1] = str(config)
    args[args.index("--host") + 1] = "127.0.0.1"
    return args


def test_the_picker_mode_routes_by_watched_objectives_with_the_charts_rbac(
    kube: Cluster, objective_crd: str
) -> None:
    network = kube.pod_network
    if kube.local and network is None:
        # The picker scrapes the endpoint it discovers: only an address of the run's own
        # namespace may be its target.
        pytest.skip("the picker test needs a network namespace for the pods (root, `ip netns`)")
    assert network is not None
    with released(kube, "lwpo", "lw-picker-objectives", *PICKER_MODE) as release:
        namespace = release.namespace
        account = kube.service_account_kubeconfig(namespace, picker_account(kube, namespace))
        assert account_rules(kube, namespace, account) == PICKER_CALLS, "the chart's RBAC"

        engine_port = free_port()
        engine = Laneway(
            ["sim", "--host", network.pod_ip, "--port", str(engine_port), "--model", RANKED],
            kube.kubeconfig,
            kube.log_path("picker-objectives-engine"),
            network.inside,
        )
        args = picker_args(kube, namespace, kube.workdir / "picker-objectives.yaml")
        grpc_port = free_port()
        args[args.index("--port") + 1] = str(grpc_port)
        args[args.index("--metrics-port") + 1] = str(free_port())
        assert "--watch-objectives" in args, args
        picker = Laneway(args, account, kube.log_path("picker-objectives"))
        target = f"127.0.0.1:{grpc_port}"
        kube.apply([objective("premium", 5)], "-n", namespace)
        engine.start()
        picker.start()
        try:
            kube.apply(ranked_pool(engine_port, network.pod_ip), "-n", namespace)
            endpoint = f"{network.pod_ip}:{engine_port}"

            def routed_as(objective_name: str, priority: int) -> Callable[[], bool]:
                return lambda: route(target, objective_name) == Routed(endpoint, priority)

            eventually(
                "the picker routes to the discovered endpoint, the listed objective's priority",
                routed_as("premium", -5),
                READY_TIMEOUT_S,
            )
            kube.apply([objective("premium", 9)], "-n", namespace)
            eventually("a changed priority counts", routed_as("premium", -9), READY_TIMEOUT_S)
            kube.apply([objective("bulk", -2)], "-n", namespace)
            eventually("an added objective counts", routed_as("bulk", 2), READY_TIMEOUT_S)
            kube.kubectl("delete", objective_crd, "premium", "-n", namespace, "--wait")
            eventually("a deleted objective counts as 0", routed_as("premium", 0), READY_TIMEOUT_S)
            assert route(target, "bulk") == Routed(endpoint, 2)
            assert picker.running(), picker.output()
        finally:
            picker.stop()
            engine.stop()
        assert "Forbidden" not in picker.output(), f"RBAC refused:\n{picker.output()}"
