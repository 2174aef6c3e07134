"""Every flag the operator renders for a vLLM pool, through the installed vLLM's own `vllm
serve` argument parser and start-up checks (support/vllm_parse_args.py, run in the tier's
venv): a flag that vLLM renamed or dropped fails here, before a pod crash-loops on it.

No server is started: the parser is what `vllm serve` runs before it loads anything. Every
case goes through one run of the parser script, since importing vLLM is most of its cost.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.pools import spec_pool
from support.vllm_engine import ServeParse, parse_serve_args

from laneway.operator.render import engine_command

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_installed")]

KV_EVENTS = {"endpoint": "tcp://laneway-gateway-kv-events.laneway.svc:5557", "blockSize": 32}
POOLS: list[tuple[str, dict[str, Any]]] = [
    ("the defaults", {"engine": {"kind": "vllm"}}),
    ("chunked prefill, priority, limits", {
        "engine": {"kind": "vllm"},
        "prefill": {"chunkedPrefill": True, "chunkSize": 512, "tokenBudget": 4096},
        "limits": {"maxContextTokens": 16384, "maxConcurrentRequests": 32},
        "scheduling": {"policy": "priority"},
    }),
    ("chunked prefill off", {
        "engine": {"kind": "vllm"},
        "prefill": {"chunkedPrefill": False, "tokenBudget": 8192},
        "limits": {"maxContextTokens": 8192},
    }),
    ("KV events", {"engine": {"kind": "vllm", "kvEvents": KV_EVENTS}}),
]  # fmt: skip


REFUSED: list[tuple[list[str], str]] = [
    (["--laneway-made-up-flag", "1"], "unrecognized arguments: --laneway-made-up-flag"),
    # V1 ignores it and v0.27 removed it (render.py says why it is never rendered).
    (["--max-num-partial-prefills", "2"], "unrecognized arguments: --max-num-partial-prefills"),
    (["--scheduling-policy", "lottery"], "invalid choice: 'lottery'"),
]


def refused_argv(flags: list[str]) -> tuple[str, ...]:
    return (*engine_command(spec_pool({"engine": {"kind": "vllm"}})).args, *flags)


@pytest.fixture(scope="module")
def parsed() -> dict[tuple[str, ...], ServeParse]:
    argvs = [engine_command(spec_pool(spec)).args for _, spec in POOLS]
    argvs += [refused_argv(flags) for flags, _ in REFUSED]
    return dict(zip(argvs, parse_serve_args(argvs), strict=True))


@pytest.mark.parametrize(("case", "spec"), POOLS, ids=[case for case, _ in POOLS])
def test_vllm_parses_every_flag_the_operator_renders(
    case: str, spec: dict[str, Any], parsed: dict[tuple[str, ...], ServeParse]
) -> None:
    pool = spec_pool(spec)
    command = engine_command(pool)
    assert command.command == ("vllm", "serve")
    answer = parsed[command.args]
    assert answer.status == 0, f"vLLM refused {command.args}:\n{answer.stderr[-3000:]}"
    settings = answer.settings
    # Parsed to the values the spec meant, not just accepted.
    limits, prefill = pool.spec.limits, pool.spec.prefill
    assert settings["model"] == pool.spec.model
    assert settings["served_model_name"] == [pool.spec.served_model_name]
    assert settings["port"] == pool.spec.port
    assert settings["max_model_len"] == limits.max_context_tokens
    assert settings["max_num_seqs"] == limits.max_concurrent_requests
    assert settings["max_num_batched_tokens"] == prefill.token_budget
    assert settings["enable_chunked_prefill"] is prefill.chunked_prefill
    if prefill.chunked_prefill:
        assert settings["long_prefill_token_threshold"] == prefill.chunk_size
    assert settings["scheduling_policy"] == pool.spec.scheduling.policy.value
    assert settings["enable_prompt_tokens_details"] is True
    kv_events = pool.spec.engine.kv_events
    if kv_events is not None:
        assert settings["block_size"] == kv_events.block_size
        # vLLM's parser turns the JSON into its KVEventsConfig.
        config = settings["kv_events_config"]
        assert "enable_kv_cache_events=True" in config
        assert "publisher='zmq'" in config
        assert f"endpoint='{kv_events.endpoint}'" in config


@pytest.mark.parametrize(("flags", "refusal"), REFUSED)
def test_a_flag_vllm_does_not_have_fails(
    flags: list[str], refusal: str, parsed: dict[tuple[str, ...], ServeParse]
) -> None:
    answer = parsed[refused_argv(flags)]
    assert answer.status == 2
    assert refusal in answer.stderr
