"""spec.lending across pools (`check_pool_set`): a lent replica runs the borrower's requests
on the lender's engine, so the borrower must be a batch pool of the same namespace and model
whose prompts fit the lender's context cap; each error says what to change."""

from __future__ import annotations

from typing import Any

import pytest
from support.crd_cases import document

from laneway import api

CHAT: dict[str, Any] = {"limits": {"maxContextTokens": 131072}, "lending": {"borrower": "docs"}}
DOCS: dict[str, Any] = {"lane": "batch", "limits": {"maxContextTokens": 131072}}


def pool(name: str, patch: dict[str, Any], namespace: str = "default") -> api.InferencePool:
    doc = document(patch)
    doc["metadata"] = {"name": name, "namespace": namespace}
    return api.parse_pool(doc)


def lending_errors(*pools: api.InferencePool) -> list[str]:
    return [
        error.message
        for error in api.check_pool_set(pools)
        if error.path == "default/chat.spec.lending.borrower"
    ]


def test_a_borrower_of_the_same_model_within_the_context_cap_passes() -> None:
    assert lending_errors(pool("chat", CHAT), pool("docs", DOCS)) == []


@pytest.mark.parametrize(
    ("borrower", "expected"),
    [
        (None, "no InferencePool 'docs' in namespace 'default'"),
        (pool("docs", DOCS, namespace="other"), "no InferencePool 'docs' in namespace 'default'"),
        (pool("docs", {**DOCS, "lane": "interactive"}), "name a batch pool"),
        (pool("docs", {**DOCS, "model": "mistral-7b"}), "lend to a pool of the same model"),
        (
            pool("docs", {**DOCS, "limits": {"maxContextTokens": 262144}}),
            "takes prompts up to limits.maxContextTokens 262144 but this pool's engine holds "
            "131072: raise this pool's limits.maxContextTokens",
        ),
    ],
    ids=["missing", "other namespace", "interactive", "other model", "longer context"],
)
def test_a_borrower_the_lenders_engine_cannot_serve_is_refused(
    borrower: api.InferencePool | None, expected: str
) -> None:
    pools = [pool("chat", CHAT)] + ([borrower] if borrower is not None else [])
    (message,) = lending_errors(*pools)
    assert expected in message


def test_lending_on_a_batch_pool_is_refused_on_its_own() -> None:
    with pytest.raises(api.SpecError, match=r"spec\.lending: is for an interactive pool"):
        pool("docs", {**DOCS, "lending": {"borrower": "chat"}})
