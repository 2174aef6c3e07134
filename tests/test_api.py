"""parse_pool: every problem in a spec is reported with its path and what to change."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from laneway.api import (
    EngineKind,
    InferencePool,
    KVEventsSpec,
    Lane,
    SpecError,
    TokenizerKind,
    TokenizerSpec,
    check_pool_set,
    parse_pool,
)


def pool_doc(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "lane": "interactive",
        "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "servedModelName": "llama3-8b",
        "engine": {"kind": "vllm"},
        "routing": {"models": ["chat"], "maxPromptTokens": 3072},
        "prefill": {"chunkSize": 512, "tokenBudget": 2048},
        "limits": {"maxContextTokens": 4096, "maxConcurrentRequests": 128},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "realtime", "namespace": "serving"},
        "spec": spec,
    }


def errors_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as raised:
        parse_pool(doc)
    return {error.path: error.message for error in raised.value.errors}


def test_valid_pool_parses_with_defaults() -> None:
    pool = parse_pool(pool_doc())
    assert pool.key == "serving/realtime"
    assert pool.spec.lane is Lane.INTERACTIVE
    assert pool.spec.engine.kind is EngineKind.VLLM
    assert pool.spec.public_models == ("chat",)
    assert pool.spec.max_prompt_tokens == 3072
    assert pool.spec.prefill.max_partial_prefills == 1
    assert pool.spec.slo.ttft_millis == 300
    assert pool.endpoints == ()


def test_public_models_default_to_the_served_name() -> None:
    doc = pool_doc(routing={})
    pool = parse_pool(doc)
    assert pool.spec.public_models == ("llama3-8b",)
    assert pool.spec.max_prompt_tokens == 4096


def test_local_endpoints_come_from_status() -> None:
    doc = pool_doc()
    doc["status"] = {"endpoints": ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]}
    assert parse_pool(doc).endpoints == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    doc["status"] = {"endpoints": ["127.0.0.1:8001"]}
    assert "status.endpoints[0]" in errors_of(doc)


@pytest.mark.parametrize(
    ("overrides", "path", "fragment"),
    [
        # chunk larger than the whole step budget can never be scheduled
        (
            {"prefill": {"chunkSize": 4096, "tokenBudget": 2048}},
            "spec.prefill.chunkSize",
            "must not exceed tokenBudget",
        ),
        # a routed prompt must fit the context the engine is started with
        (
            {"routing": {"maxPromptTokens": 8192}},
            "spec.routing.maxPromptTokens",
            "must not exceed limits.maxContextTokens",
        ),
        (
            {"routing": {"minPromptTokens": 3000, "maxPromptTokens": 1000}},
            "spec.routing.minPromptTokens",
            "must not exceed maxPromptTokens",
        ),
        # vLLM: one step must hold a token for every running sequence
        (
            {"limits": {"maxContextTokens": 4096, "maxConcurrentRequests": 4096}},
            "spec.prefill.tokenBudget",
            ">= limits.maxConcurrentRequests",
        ),
        # vLLM without chunking must fit a whole prompt in one step
        (
            {"prefill": {"chunkedPrefill": False, "chunkSize": 512, "tokenBudget": 2048}},
            "spec.prefill.tokenBudget",
            "set prefill.chunkedPrefill: true",
        ),
        ({"lane": "realtime"}, "spec.lane", "must be one of interactive, batch"),
        ({"engine": {"kind": "tgi"}}, "spec.engine.kind", "must be one of vllm, sglang"),
        ({"replicas": -1}, "spec.replicas", "must be >= 0"),
        ({"replicas": "two"}, "spec.replicas", "must be an integer"),
        ({"port": 70000}, "spec.port", "must be <= 65535"),
        ({"prefill": "fast"}, "spec.prefill", "must be an object"),
        ({"routing": {"models": "chat"}}, "spec.routing.models", "list of non-empty strings"),
        ({"selector": {"matchLabels": {}}}, "spec.selector.matchLabels", "at least one label"),
    ],
)
def test_invalid_specs_name_the_field(overrides: dict[str, Any], path: str, fragment: str) -> None:
    errors = errors_of(pool_doc(**overrides))
    assert path in errors, errors
    assert fragment in errors[path]


def test_sglang_has_no_vllm_budget_rule() -> None:
    pool = parse_pool(
        pool_doc(
            engine={"kind": "sglang"},
            limits={"maxContextTokens": 4096, "maxConcurrentRequests": 4096},
        )
    )
    assert pool.spec.engine.kind is EngineKind.SGLANG


def test_every_error_is_reported_at_once() -> None:
    doc = pool_doc(lane=None, model=None, replicas=-3)
    doc["apiVersion"] = "v1"
    del doc["metadata"]["name"]
    errors = errors_of(doc)
    assert {"apiVersion", "metadata.name", "spec.lane", "spec.model", "spec.replicas"} <= set(
        errors
    )


def named(doc: dict[str, Any], name: str) -> InferencePool:
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = name
    return parse_pool(doc)


def test_overlapping_interactive_ranges_are_rejected_unless_prioritised() -> None:
    first = named(pool_doc(routing={"models": ["chat"], "maxPromptTokens": 3072}), "a")
    second = named(
        pool_doc(routing={"models": ["chat"], "minPromptTokens": 2000, "maxPromptTokens": 4000}),
        "b",
    )
    [error] = check_pool_set([first, second])
    assert "overlaps pool serving/a" in error.message
    disjoint = named(
        pool_doc(routing={"models": ["chat"], "minPromptTokens": 3073, "maxPromptTokens": 4000}),
        "c",
    )
    assert check_pool_set([first, disjoint]) == []
    preferred = named(
        pool_doc(routing={"models": ["chat"], "maxPromptTokens": 4000, "priority": 10}), "d"
    )
    assert check_pool_set([first, preferred]) == []
    other_model = named(pool_doc(routing={"models": ["other"], "maxPromptTokens": 3072}), "e")
    assert check_pool_set([first, other_model]) == []


def test_null_is_absent_as_the_api_server_prunes_it() -> None:
    pool = parse_pool(pool_doc(autoscaling=None, selector=None, tokenizer=None))
    assert (pool.spec.autoscaling, pool.spec.selector, pool.spec.tokenizer) == (None, None, None)
    assert (
        parse_pool(pool_doc(engine={"kind": "vllm", "kvEvents": None})).spec.engine.kv_events
        is None
    )


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        # a typo is named with the field it is close to
        (
            {"routing": {"maxPromtTokens": 3072}},
            "spec.routing.maxPromtTokens",
            "is not a field; did you mean maxPromptTokens?",
        ),
        # documents use the wire names only, whatever Python calls the attribute
        (
            {"served_model_name": "x"},
            "spec.served_model_name",
            "is not a field; did you mean servedModelName?",
        ),
        ({"prefill": {"tokenBudget": "2048"}}, "spec.prefill.tokenBudget", "must be an integer"),
        ({"prefill": {"chunkedPrefill": "yes"}}, "spec.prefill.chunkedPrefill", "true or false"),
        (
            {"tolerations": [{"key": "gpu", "operator": "Maybe"}]},
            "spec.tolerations[0].operator",
            "must be one of Exists, Equal, got 'Maybe'",
        ),
        ({"nodeSelector": {"gpu": 1}}, "spec.nodeSelector", "must map strings to strings"),
        ({"model": "m" * 513}, "spec.model", "must be at most 512 characters, got 513"),
        ({"engine": {"kind": "vllm", "args": ["--x"] * 129}}, "spec.engine.args", "at most 128"),
        ({"engine": {}}, "spec.engine.kind", "is required, one of vllm, sglang, simulator"),
    ],
)
def test_shape_errors_are_worded_from_the_schema(
    overrides: dict[str, Any], path: str, message: str
) -> None:
    errors = errors_of(pool_doc(**overrides))
    assert path in errors, errors
    assert message in errors[path]


def test_parsed_objects_are_frozen_and_built_by_attribute_name() -> None:
    pool = parse_pool(pool_doc(tokenizer={"kind": "tiktoken", "encoding": "cl100k_base"}))
    with pytest.raises(ValidationError):
        pool.spec.prefill.chunk_size = 1
    assert pool.spec.tokenizer is not None
    # The gateway keys its loaded tokenizers by spec.
    assert {pool.spec.tokenizer: 1}[
        TokenizerSpec(kind=TokenizerKind.TIKTOKEN, encoding="cl100k_base")
    ]
    assert KVEventsSpec(endpoint="tcp://gw:1", block_size=32).block_size == 32
