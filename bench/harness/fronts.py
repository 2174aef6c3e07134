"""What a live run's clients send to: the standalone `laneway gateway`, or a real Envoy
with `laneway epp` as its endpoint picker (configured as Gateway API implementations
configure one for an InferencePool, bench/harness/envoy.py). Either way one URL to send
to, one to read the laneway metrics from, and the CPU of every process in the path."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from laneway.bench.harness.envoy import Ports, envoy_config, free_port, start_envoy
from laneway.bench.harness.live_cluster import start_gateway
from laneway.bench.harness.procs import ChildProcess, Children

GATEWAY = "gateway"
ENVOY_LANEWAY = "envoy+laneway"
FRONTS = (GATEWAY, ENVOY_LANEWAY)


@dataclass(frozen=True)
class Front:
    name: str  # one of FRONTS
    url: str  # where clients send
    metrics_url: str  # laneway's /metrics (the gateway's, or the picker's own port)
    processes: tuple[ChildProcess, ...]

    def cpu_seconds(self) -> float:
        return sum(process.cpu_seconds() for process in self.processes)


async def start_front(
    children: Children,
    name: str,
    documents: Sequence[Mapping[str, Any]],
    endpoints: Sequence[str],
    wait_s: int,
) -> Front:
    """`name` (one of FRONTS) configured with `documents`, in front of `endpoints`;
    `wait_s`: the longest a request may wait in a pool's line."""
    if name == GATEWAY:
        gateway = await start_gateway(children, documents)
        return Front(name=name, url=gateway.url, metrics_url=gateway.url, processes=(gateway,))
    port, metrics_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="laneway-epp-") as directory:
        path = Path(directory) / "pools.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        args = ["--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
        picker = await children.start_laneway_async(
            "epp", [*args, "--metrics-port", str(metrics_port)]
        )
    # With `request.time`, the picker's TTFT starts when Envoy read the request, as the
    # client's does, rather than a hop later.
    config = envoy_config(
        ports=Ports.free(),
        picker=f"127.0.0.1:{port}",
        endpoints=endpoints,
        wait_s=wait_s,
        request_time=True,
    )
    with tempfile.TemporaryDirectory(prefix="laneway-envoy-") as folder:
        envoy = await asyncio.to_thread(start_envoy, children, Path(folder), config, name=name)
    return Front(
        name=name,
        url=envoy.url,
        metrics_url=f"http://127.0.0.1:{metrics_port}",
        processes=(envoy, picker),
    )
