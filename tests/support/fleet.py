"""The state-layer tests' fleet: simulated engines and gateway processes sharing a Redis."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from laneway.api import API_VERSION
from laneway.bench.demo.run import DEMO_POOLS, config_documents
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.simulator.profiles import DEFAULT_PROFILE
from laneway.simulator.seed import PUBLIC_MODEL

# Picks from the gateways' own in-flight accounting alone, so that what one replica sees of
# another's load comes through Redis and not through the engines' scraped metrics.
IN_FLIGHT_ONLY = {
    "apiVersion": API_VERSION,
    "kind": "GatewayConfig",
    "spec": {
        "picking": {
            "weights": {
                "queueDepth": 0,
                "kvCacheUsage": 0,
                "inFlightRequests": 1,
                "prefillTokens": 0,
            }
        }
    },
}


def start_engines(
    children: Children, replicas: Mapping[str, int], time_scale: float
) -> dict[str, list[ChildProcess]]:
    """`laneway sim` processes for the demo's pools ("chat", "documents"), by pool name."""
    engines: dict[str, list[ChildProcess]] = {}
    for pool in DEMO_POOLS:
        engines[pool.name] = [
            children.start_laneway(
                "sim", pool.sim_args(DEFAULT_PROFILE, time_scale), name=f"{pool.name}-{i}"
            )
            for i in range(replicas.get(pool.name, 1))
        ]
    return engines


def write_config(path: Path, engines: Mapping[str, Sequence[ChildProcess]]) -> Path:
    endpoints = {name: [e.url for e in pool] for name, pool in engines.items()}
    path.write_text(yaml.safe_dump_all([*config_documents(endpoints), IN_FLIGHT_ONLY]))
    return path


def start_gateway(
    children: Children, config: Path, redis_url: str, *extra: str, name: str = "gateway"
) -> ChildProcess:
    args = ["--config", str(config), "--host", "127.0.0.1", "--port", "0"]
    return children.start_laneway("gateway", [*args, "--redis-url", redis_url, *extra], name=name)


def metric(child: ChildProcess, name: str, **labels: str) -> int:
    """A sample from a process's own /metrics, summed over other labels (0 before any)."""
    with urllib.request.urlopen(f"{child.url}/metrics", timeout=60) as response:
        text = response.read().decode()
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def running_requests(engine: ChildProcess) -> int:
    return metric(engine, "vllm:num_requests_running")


def finished_requests(engine: ChildProcess) -> int:
    return metric(engine, "vllm:request_success_total")


def chat_line(custom_id: str, text: str, max_tokens: int = 8) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": PUBLIC_MODEL,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
            },
        }
    )


def wait_for(what: str, check: Callable[[], Any], patience: float = 60.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `patience`."""
    deadline = time.monotonic() + patience
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {patience:g} s")
        time.sleep(0.1)


def http(
    method: str,
    url: str,
    body: object = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any, Mapping[str, str]]:
    """One request with urllib: (status, decoded JSON body, headers), errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read()), dict(error.headers)
