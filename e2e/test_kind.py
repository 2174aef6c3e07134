"""laneway on a real Kubernetes cluster (kind): the chart, the operator, the gateway, both lanes.

e2e/kind.sh creates the cluster, builds and loads the image and installs the chart; these
tests apply the simulator pools from manifests/examples/, wait for the operator to make them
Ready, and talk to the gateway Service through `kubectl port-forward` with the official
`openai` client. Where Docker (with a running engine), kind, kubectl or helm is missing, every
test here is skipped with the reason; nothing pretends to pass.

  .venv/bin/python -m pytest e2e/test_kind.py        # LANEWAY_E2E_KEEP=1 keeps the cluster
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.kube.laneway import check_long_request_streams_to_batch, lane_pool, public_model

ROOT = Path(__file__).resolve().parent.parent
KIND_SH = ROOT / "e2e" / "kind.sh"
EXAMPLES = ROOT / "manifests" / "examples" / "simulator-pools.yaml"
NAMESPACE = os.environ.get("LANEWAY_E2E_NAMESPACE", "laneway")
GATEWAY_SERVICE = "svc/laneway-gateway"
API_KEY_SECRET = "laneway-api-key"  # the key the chart generated for release "laneway"
GATEWAY_PORTS = (80, 9090)  # the Service's API and metrics ports
READY_TIMEOUT_S = 300

Manifest = dict[str, Any]


def missing_tools() -> str | None:
    """Why this machine cannot run the suite, or None when it can."""
    absent = [tool for tool in ("docker", "kind", "kubectl") if shutil.which(tool) is None]
    if shutil.which("helm") is None and not (ROOT / ".tools" / "bin" / "helm").exists():
        absent.append("helm")
    if absent:
        return f"kind e2e needs {', '.join(absent)} on PATH"
    info = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the Docker engine is not reachable: {last}"
    return None


def kubectl(*args: str, stdin: str | None = None, timeout: float = 120) -> str:
    result = subprocess.run(
        ["kubectl", "--namespace", NAMESPACE, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def eventually(what: str, check: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting until {what}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    reason = missing_tools()
    if reason is not None:
        pytest.skip(reason)
    print("e2e: bringing up the kind cluster (minutes)", file=sys.stderr)
    up = subprocess.run(["bash", str(KIND_SH), "up"], timeout=1800, check=False)
    if up.returncode != 0:
        pytest.fail(f"e2e/kind.sh up exited {up.returncode}; its progress is above")
    yield
    if os.environ.get("LANEWAY_E2E_KEEP") != "1":
        subprocess.run(["bash", str(KIND_SH), "down"], timeout=600, check=False)


def example_pools() -> list[Manifest]:
    pools = [d for d in yaml.safe_load_all(EXAMPLES.read_text()) if d]
    for pool in pools:
        pool["metadata"]["namespace"] = NAMESPACE
    return pools


def pool_status(name: str) -> Manifest:
    status: Manifest = json.loads(kubectl("get", "inferencepool", name, "-o", "json"))
    return status


def apply_and_wait_ready(pools: list[Manifest]) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(pools))
    for pool in pools:
        kubectl(
            "wait",
            f"inferencepool/{pool['metadata']['name']}",
            "--for=condition=Ready",
            f"--timeout={READY_TIMEOUT_S}s",
            timeout=READY_TIMEOUT_S + 30,
        )


@pytest.fixture(scope="module")
def pools(cluster: None) -> list[Manifest]:
    pools = example_pools()
    assert {p["spec"]["lane"] for p in pools} == {"interactive", "batch"}
    apply_and_wait_ready(pools)
    return pools


@pytest.fixture(scope="module")
def forwarded(pools: list[Manifest]) -> Iterator[dict[int, str]]:
    """The gateway Service's ports, forwarded to this machine: Service port -> local URL."""
    kubectl("rollout", "status", "deployment/laneway-gateway", "--timeout=180s", timeout=200)
    forward = subprocess.Popen(
        [
            *("kubectl", "--namespace", NAMESPACE, "port-forward", GATEWAY_SERVICE),
            *(f":{port}" for port in GATEWAY_PORTS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        local: list[str] = []
        while len(local) < len(GATEWAY_PORTS):
            line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
            if not line:
                pytest.fail("kubectl port-forward exited")
            match = re.search(r"127\.0\.0\.1:(\d+)", line)
            if match is not None:
                local.append(f"http://127.0.0.1:{match.group(1)}")
        yield dict(zip(GATEWAY_PORTS, local, strict=True))
    finally:
        forward.terminate()
        forward.wait(timeout=10)


@pytest.fixture(scope="module")
def gateway_url(pools: list[Manifest], forwarded: dict[int, str]) -> str:
    url = forwarded[GATEWAY_PORTS[0]]
    names = {p["spec"].get("servedModelName", p["spec"]["model"]) for p in pools}
    eventually("the gateway lists the pools' models", lambda: names <= set(models(url)), 120)
    return url


@pytest.fixture(scope="module")
def metrics_url(forwarded: dict[int, str]) -> str:
    return forwarded[GATEWAY_PORTS[1]]


@functools.cache
def api_key() -> str:
    """The key the chart generated at install, read as its notes say."""
    encoded = kubectl("get", "secret", API_KEY_SECRET, "-o", "jsonpath={.data.api-key}")
    return base64.b64decode(encoded).decode()


def models(url: str) -> list[str]:
    request = urllib.request.Request(
        f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key()}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return [m["id"] for m in json.load(response)["data"]]
    except OSError:
        return []


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key(), max_retries=0, timeout=120)


@pytest.mark.kind
def test_example_pools_report_ready_status(pools: list[Manifest]) -> None:
    for pool in pools:
        current = pool_status(pool["metadata"]["name"])
        status = current["status"]
        assert status["observedGeneration"] == current["metadata"]["generation"]
        assert status["readyReplicas"] == pool["spec"]["replicas"]
        assert len(status["endpoints"]) == pool["spec"]["replicas"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", ready
        assert str(pool["spec"]["limits"]["maxContextTokens"]) in status["engineArgs"]


@pytest.mark.kind
def test_short_request_takes_the_interactive_lane(pools: list[Manifest], gateway_url: str) -> None:
    interactive = lane_pool(pools, "interactive")
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model=public_model(interactive),
        messages=[{"role": "user", "content": "Where is my order?"}],
        max_tokens=8,
    )
    assert raw.headers["x-laneway-lane"] == "interactive"
    assert raw.headers["x-laneway-pool"] == interactive["metadata"]["name"]
    assert int(raw.headers["x-laneway-prompt-tokens"]) < 100
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 8


@pytest.mark.kind
def test_long_request_takes_the_batch_lane_and_streams(
    pools: list[Manifest], gateway_url: str
) -> None:
    check_long_request_streams_to_batch(client(gateway_url), pools)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.kind
def test_gateway_metrics_count_requests_per_lane(
    pools: list[Manifest], gateway_url: str, metrics_url: str
) -> None:
    with pytest.raises(urllib.error.HTTPError) as on_api_port:
        urllib.request.urlopen(f"{gateway_url}/metrics", timeout=10)
    assert on_api_port.value.code == 404  # served on the metrics port only
    on_api_port.value.close()
    interactive = lane_pool(pools, "interactive")
    for _ in range(3):
        client(gateway_url).chat.completions.create(
            model=public_model(interactive),
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
        )
    samples = scrape(metrics_url)
    answered = sum(
        value
        for (name, labels), value in samples.items()
        if name == "laneway_gateway_requests_total"
        and ("lane", "interactive") in labels
        and ("status", "200") in labels
    )
    assert answered >= 3
    expected = {p["metadata"]["name"]: p["spec"]["replicas"] for p in pools}

    def every_endpoint_available() -> bool:
        available = {
            dict(labels)["pool"]: value
            for (name, labels), value in scrape(metrics_url).items()
            if name == "laneway_gateway_endpoints" and ("state", "available") in labels
        }
        return all(available.get(key) == count for key, count in expected.items())

    eventually("the gateway counts every engine replica as available", every_endpoint_available)


@pytest.mark.kind
def test_a_deleted_pool_drains_from_the_gateway(gateway_url: str, metrics_url: str) -> None:
    pool = example_pools()[0]
    name = "e2e-drain"
    pool["metadata"]["name"] = name
    pool["spec"]["replicas"] = 1
    pool["spec"]["servedModelName"] = "e2e-drain-model"
    apply_and_wait_ready([pool])
    eventually(
        "the gateway routes to the new pool", lambda: "e2e-drain-model" in models(gateway_url)
    )
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="e2e-drain-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert raw.headers["x-laneway-pool"] == name

    kubectl("delete", "inferencepool", name, "--wait=true", timeout=180)
    eventually(
        "the gateway drops the deleted pool's model",
        lambda: "e2e-drain-model" not in models(gateway_url),
    )
    with pytest.raises(openai.NotFoundError):
        client(gateway_url).chat.completions.create(
            model="e2e-drain-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    eventually(
        "the pool's endpoints leave the gateway's metrics",
        lambda: not any(("pool", name) in labels for _, labels in scrape(metrics_url)),
    )
    eventually(
        "the pool's engine Deployment is garbage-collected with it",
        lambda: (
            not json.loads(
                kubectl("get", "deployments", "-l", f"laneway.io/pool={name}", "-o", "json")
            )["items"]
        ),
    )


def test_kind_script_says_what_is_missing_and_touches_nothing(tmp_path: Path) -> None:
    """Without the tools (here: a PATH with none of them), `kind.sh up` stops before doing
    anything, with exit 3 and the names of what is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    isolated = tmp_path / "checkout"
    (isolated / "e2e").mkdir(parents=True)
    shutil.copy2(KIND_SH, isolated / "e2e" / "kind.sh")
    result = subprocess.run(
        [str(bin_dir / "bash"), str(isolated / "e2e" / "kind.sh"), "up"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 3, result.stderr
    assert "e2e/kind.sh: missing: docker kind kubectl helm" in result.stderr
