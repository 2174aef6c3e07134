"""The pools and gateway configs that put simulated engines behind a gateway.

The one place tests build them: `pool_doc` and `gateway_doc` write the documents a
`laneway gateway --config` reads (support.launch starts such a gateway as a process,
support.inproc in the test's own event loop), and `simulated_pool` / `lane_pool` give
parsed pools for in-process gateways and the routing library's tables.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from laneway.api import API_VERSION, KIND, InferencePool, parse_pool

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


def fed_docs(engine_url: str) -> dict[str, Any]:
    """A batch pool `docs` of one chunked engine with a step budget of one 2048-token chunk:
    the ledger feeds it a document per free prefill (the one prefilling and the next)."""
    docs = pool_doc(
        "docs",
        "batch",
        "llama-long",
        [engine_url],
        limits={"maxContextTokens": 131072, "maxConcurrentRequests": 8},
    )
    docs["spec"]["prefill"] = {"chunkedPrefill": True, "chunkSize": 2048, "tokenBudget": 2048}
    return docs


LENDING_CONTEXT = 131072  # the lending pools' context: documents fit the chat replicas


def lending_docs(chat_urls: list[str]) -> list[dict[str, Any]]:
    """A chat pool over `chat_urls` lending to a docs pool with no replica of its own, and a
    gateway config that lends at once and ticks every 50 ms. One chat turn a replica
    (maxConcurrentRequests 1, no headroom): a second turn while one runs needs a second
    replica; a document runs only where chat lent one."""
    chat = pool_doc(
        "chat",
        "interactive",
        "llama-long",
        chat_urls,
        limits={"maxConcurrentRequests": 1, "maxContextTokens": LENDING_CONTEXT},
    )
    chat["spec"]["lending"] = {"borrower": "docs", "keepReplicas": 1, "headroom": 0}
    docs = pool_doc(
        "docs",
        "batch",
        "llama-long",
        [],
        limits={"maxConcurrentRequests": 4, "maxContextTokens": LENDING_CONTEXT},
    )
    lending = {"lendAfterMillis": 0, "intervalMillis": 50}
    return [chat, docs, gateway_doc(lending=lending, queue={"timeoutMillis": 120000})]


def spec_pool(spec: dict[str, Any], name: str = "pool", uid: str = "") -> InferencePool:
    """A parsed pool of `spec` over a minimal one (interactive, org/model served as m), for
    the operator's renderer."""
    base: dict[str, Any] = {"lane": "interactive", "model": "org/model", "servedModelName": "m"}
    metadata: dict[str, Any] = {"name": name, "namespace": "serving"}
    if uid:
        metadata["uid"] = uid
    return parse_pool(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": metadata,
            "spec": {**base, **copy.deepcopy(spec)},
        }
    )
