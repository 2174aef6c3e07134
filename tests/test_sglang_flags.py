"""Every flag the operator renders for an SGLang pool, through SGLang's own parser of the
release its image runs (support/sglang_parse_args.py, in the venv scripts/install-sglang.sh
makes): a flag SGLang renamed or dropped fails here, before a pod crash-loops on it."""

from __future__ import annotations

from typing import Any

import pytest
from support.pools import spec_pool
from support.sglang_parser import SGLANG_VERSION, installed, parse_launch_args
from support.vllm_engine import ServeParse

from laneway.api import EngineKind
from laneway.operator.render import DEFAULT_IMAGES, engine_command

pytestmark = pytest.mark.sglang

POOLS: list[tuple[str, dict[str, Any]]] = [
    ("the defaults", {"engine": {"kind": "sglang"}}),
    ("chunked prefill, priority, limits", {
        "engine": {"kind": "sglang"},
        "prefill": {"chunkedPrefill": True, "chunkSize": 512, "tokenBudget": 4096},
        "limits": {"maxContextTokens": 16384, "maxConcurrentRequests": 32},
        "scheduling": {"policy": "priority"},
    }),
    ("chunked prefill off", {
        "engine": {"kind": "sglang"},
        "prefill": {"chunkedPrefill": False, "tokenBudget": 8192},
        "limits": {"maxContextTokens": 8192},
    }),
    ("chunked prefill off, priority", {
        "engine": {"kind": "sglang"},
        "prefill": {"chunkedPrefill": False},
        "scheduling": {"policy": "priority"},
    }),
]  # fmt: skip
# No engine.kvEvents case: the spec refuses it for SGLang (its events do not chain blocks as
# the gateway reads them), so the operator never renders --kv-events-config for it.

REFUSED: list[tuple[list[str], str]] = [
    (["--laneway-made-up-flag", "1"], "unrecognized arguments: --laneway-made-up-flag"),
    # vLLM's name for it: SGLang's is --schedule-policy.
    (["--scheduling-policy", "priority"], "unrecognized arguments: --scheduling-policy"),
    (["--schedule-policy", "lottery"], "invalid choice: 'lottery'"),
]


def refused_argv(flags: list[str]) -> tuple[str, ...]:
    return (*engine_command(spec_pool({"engine": {"kind": "sglang"}})).args, *flags)


@pytest.fixture(scope="module")
def parsed() -> dict[tuple[str, ...], ServeParse]:
    reason = installed()
    if reason is not None:
        pytest.skip(reason)
    argvs = [engine_command(spec_pool(spec)).args for _, spec in POOLS]
    argvs += [refused_argv(flags) for flags, _ in REFUSED]
    return dict(zip(argvs, parse_launch_args(argvs), strict=True))


def test_the_parser_is_the_release_the_operators_image_runs() -> None:
    assert DEFAULT_IMAGES[EngineKind.SGLANG].endswith(f":v{SGLANG_VERSION}")


@pytest.mark.parametrize(("case", "spec"), POOLS, ids=[case for case, _ in POOLS])
def test_sglang_parses_every_flag_the_operator_renders(
    case: str, spec: dict[str, Any], parsed: dict[tuple[str, ...], ServeParse]
) -> None:
    pool = spec_pool(spec)
    command = engine_command(pool)
    assert command.command == ("python3", "-m", "sglang.launch_server")
    answer = parsed[command.args]
    # argparse's last line says why; the usage above it lists every flag.
    why = answer.stderr.strip().splitlines()[-1:]
    assert answer.status == 0, f"SGLang refused {command.args}: {why}"
    settings = answer.settings
    # Parsed to the values the spec meant, not just accepted.
    limits, prefill = pool.spec.limits, pool.spec.prefill
    priority = pool.spec.scheduling.policy.value == "priority"
    assert settings["model_path"] == pool.spec.model
    assert settings["served_model_name"] == pool.spec.served_model_name
    assert settings["port"] == pool.spec.port
    assert settings["context_length"] == limits.max_context_tokens
    assert settings["max_running_requests"] == limits.max_concurrent_requests
    assert settings["max_prefill_tokens"] == prefill.token_budget
    chunk = prefill.chunk_size if prefill.chunked_prefill else -1
    assert settings["chunked_prefill_size"] == chunk
    assert settings["enable_mixed_chunk"] is prefill.chunked_prefill
    assert settings["enable_metrics"] is True
    assert settings["enable_cache_report"] is True
    assert settings["enable_priority_scheduling"] is priority
    assert settings["schedule_low_priority_values_first"] is priority
    if priority:
        assert settings["schedule_policy"] == "fcfs"


@pytest.mark.parametrize(("flags", "refusal"), REFUSED)
def test_a_flag_sglang_does_not_have_fails(
    flags: list[str], refusal: str, parsed: dict[tuple[str, ...], ServeParse]
) -> None:
    answer = parsed[refused_argv(flags)]
    assert answer.status == 2
    assert refusal in answer.stderr
