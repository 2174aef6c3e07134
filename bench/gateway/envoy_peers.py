"""Envoy among `laneway bench gateway --against`'s routers: alone (round robin over the
engines), with the least a Python picker can do (bench/gateway/floor_picker.py, the floor)
on `grpc.aio` and on grpcio's thread-pool server (the goal's ratio is against the cheaper),
and with `laneway epp`: the Gateway API's way of putting a picker in front of a pool
(bench/harness/envoy.py configures it as the tests do). Envoy and its picker are pinned to
the routers' one CPU together, and their CPU is counted together."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from laneway.bench.gateway import floor_picker
from laneway.bench.harness.envoy import Ports, envoy_binary, envoy_config, free_port, start_envoy
from laneway.bench.harness.machine import pin
from laneway.bench.harness.procs import ChildProcess, Children

ENVOY = "envoy"
ENVOY_FLOOR = "envoy+floor"  # on grpc.aio
ENVOY_FLOOR_THREADS = "envoy+floor-threads"  # on grpcio's thread-pool server
ENVOY_LANEWAY = "envoy+laneway"
ENVOY_PEERS = (ENVOY, ENVOY_FLOOR, ENVOY_FLOOR_THREADS, ENVOY_LANEWAY)
FLOOR_SERVERS = {ENVOY_FLOOR: floor_picker.AIO, ENVOY_FLOOR_THREADS: floor_picker.THREADS}


@dataclass(frozen=True)
class Together:
    """Envoy and its picker as one router: Envoy's URL, both processes' CPU."""

    processes: tuple[ChildProcess, ...]

    @property
    def url(self) -> str:
        return self.processes[0].url

    @property
    def pid(self) -> int:
        return self.processes[-1].pid  # the picker's, where there is one (for --profile)

    def cpu_seconds(self) -> float:
        return sum(process.cpu_seconds() for process in self.processes)


def envoy_version() -> str:
    shown = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True)
    # "PATH  version: SHA/1.40.0/Clean/RELEASE/BoringSSL"
    parts = shown.stdout.rpartition("version:")[2].strip().split("/")
    return parts[1] if len(parts) > 1 else "unknown"


async def start_envoy_peer(
    children: Children,
    peer: str,
    worker_urls: Sequence[str],
    documents: Sequence[Mapping[str, Any]],
    cpu: int,
    *,
    laneway_from: Path | None = None,
) -> Together:
    """`peer` (one of ENVOY_PEERS, or envoy+laneway@DIR: `laneway_from` is DIR) in front of
    `worker_urls`, pinned to `cpu`; `documents` configure laneway's picker."""
    picker: ChildProcess | None = None
    port = free_port()
    if peer == ENVOY_LANEWAY or laneway_from is not None:
        env = {"PYTHONPATH": str(laneway_from)} if laneway_from is not None else None
        with tempfile.TemporaryDirectory(prefix="laneway-epp-") as directory:
            path = Path(directory) / "pools.yaml"
            path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
            args = ["--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
            picker = await children.start_laneway_async(
                "epp", [*args, "--metrics-port", "0"], env=env
            )
        pin(picker.pid, [cpu])
    elif peer in FLOOR_SERVERS:
        server = FLOOR_SERVERS[peer]
        argv = ["taskset", "-c", str(cpu), *floor_picker.argv(worker_urls, port, server)]
        picker = await asyncio.to_thread(
            children.start, f"{peer} picker", argv, floor_picker.READY_LINE
        )
    config = envoy_config(
        ports=Ports.free(),
        picker=f"127.0.0.1:{port}" if picker is not None else None,
        endpoints=worker_urls,
    )
    # Envoy reads its bootstrap as it starts; the folder (its log included) goes after.
    with tempfile.TemporaryDirectory(prefix="laneway-envoy-") as folder:
        envoy = await asyncio.to_thread(
            start_envoy, children, Path(folder), config, name=peer, cpu=cpu
        )
    return Together(processes=(envoy,) if picker is None else (envoy, picker))
