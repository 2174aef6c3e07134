"""Simulated engines and the pools and gateway configs that put them behind a gateway.

The one place tests build them: `start_sim` starts a `laneway sim`, `pool_doc` and
`gateway_doc` write the documents a `laneway gateway --config` reads (`start_gateway`,
`start_single_pool`), and `simulated_pool` / `lane_pool` give parsed pools for in-process
gateways and the routing library's tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from laneway.api import API_VERSION, KIND, InferencePool, parse_pool
from laneway.bench.harness.procs import ChildProcess, Children

FAST = "20"  # engine time scale for tests that only need answers, not long streams
MAX_BODY = 1024 * 1024


def simulated_pool(name: str, endpoints: Sequence[str], **spec: Any) -> InferencePool:
    """Pool `name` serving model `name` unless `spec` overrides it (or any other spec field)."""
    return parse_pool(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {"lane": "interactive", "model": name, "engine": {"kind": "simulator"}, **spec},
            "status": {"endpoints": list(endpoints)},
        }
    )


def pool_doc(
    name: str,
    lane: str,
    served: str,
    endpoints: Sequence[str],
    routing: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pool `name` on the `lane` lane, serving `served` to requests for "llama" unless
    `routing` names other models."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "lane": lane,
            "model": served,
            "servedModelName": served,
            "engine": {"kind": "simulator"},
            "routing": {"models": ["llama"], **(routing or {})},
            "limits": limits or {},
        },
        "status": {"endpoints": list(endpoints)},
    }


def lane_pool(name: str, lane: str, context: int, **routing: Any) -> InferencePool:
    """A parsed pool without endpoints, for classification tables: `context` tokens wide."""
    return parse_pool(
        pool_doc(name, lane, f"model-{name}", [], routing, {"maxContextTokens": context})
    )


def gateway_doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GatewayConfig",
        "metadata": {"name": "test"},
        "spec": {"maxBodyBytes": MAX_BODY, **spec},
    }


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
