"""`laneway sim` and `laneway gateway` as processes, for the tests about the processes
themselves (their command line, signals, drain) and about faults that kill them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from laneway.bench.harness.procs import ChildProcess, Children
from support.pools import gateway_doc, pool_doc


def start_sim(children: Children, model: str, *extra: str) -> ChildProcess:
    args = ["--host", "127.0.0.1", "--port", "0", "--model", model, *extra]
    return children.start_laneway("sim", args, name=f"sim {model}")


def start_gateway(
    children: Children, path: Path, documents: list[dict[str, Any]], *extra: str
) -> ChildProcess:
    """A gateway reading `documents` from `path`; `extra`: more command-line flags."""
    path.write_text(yaml.safe_dump_all(documents))
    args = ["--config", str(path), "--host", "127.0.0.1", "--port", "0", *extra]
    return children.start_laneway("gateway", args)


def start_single_pool(
    children: Children,
    tmp_path: Path,
    time_scale: str,
    name: str = "solo",
    limits: dict[str, Any] | None = None,
    **gateway_spec: Any,
) -> tuple[ChildProcess, ChildProcess]:
    """One engine, the only pool behind a gateway: (engine, gateway)."""
    engine = start_sim(children, "llama-small", "--time-scale", time_scale)
    gateway = start_gateway(
        children,
        tmp_path / "gateway.yaml",
        [
            pool_doc(name, "interactive", "llama-small", [engine.url], limits=limits),
            gateway_doc(**gateway_spec),
        ],
    )
    return engine, gateway
