"""What a `laneway bench gateway` run is: its options, the engines it starts and the pools
and settings its gateway is configured with."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneway.api import API_VERSION, KIND
from laneway.errors import UsageError
from laneway.simulator.profiles import PROFILES

MODEL = "bench"
DEFAULT_CONCURRENCY = (1, 50, 200, 500)
INTERACTIVE_MAX_PROMPT = 4096
ROUNDS = 2  # per level and path
WARMUP_REQUESTS = 200  # per path, before the first level
ZERO_PROFILE = "zero"


def engine_args(profile: str = ZERO_PROFILE) -> tuple[str, ...]:
    """A simulated engine with room for every concurrent stream. With the zero profile it
    answers at once, so the gateway's own cost decides the pace; with a hardware profile
    its tokens come at a real engine's pace."""
    return (
        "--host", "127.0.0.1", "--port", "0", "--model", MODEL, "--profile", profile,
        "--max-num-seqs", "4096", "--token-budget", "8192", "--max-context", "8192",
    )  # fmt: skip


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests: int | None = None  # per level and path; None: max(400, 8 x concurrency)
    prompt_tokens: int = 200
    output_tokens: int = 16
    classify_tokens: int = 131_072
    classify_repeats: int = 15
    seed: int = 0
    # Pin the gateway to a CPU of its own, the client and the engine to the others, so
    # that what it adds is not CPU it takes from them.
    own_core: bool = False
    engine_profile: str = ZERO_PROFILE
    engines: int = 1
    # Each client's mean wait before each request; 0: none, the next goes as one ends.
    think_ms: float = 0.0

    def requests_at(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(400, 8 * concurrency)


def check_options(options: BenchOptions) -> None:
    if not options.concurrency or any(c < 1 for c in options.concurrency):
        raise UsageError("--concurrency needs one or more positive integers, e.g. 1,50,200")
    if options.requests is not None and options.requests < 1:
        raise UsageError(f"--requests must be at least 1, got {options.requests}")
    if options.prompt_tokens < 1 or options.prompt_tokens > INTERACTIVE_MAX_PROMPT:
        raise UsageError(f"--prompt-tokens must be within 1-{INTERACTIVE_MAX_PROMPT}")
    if options.output_tokens < 1:
        raise UsageError("--output-tokens must be at least 1")
    if options.engine_profile not in PROFILES:
        known = ", ".join(sorted(PROFILES))
        raise UsageError(f"--engine-profile must be one of {known}, got {options.engine_profile!r}")
    if options.engines < 1:
        raise UsageError(f"--engines must be at least 1, got {options.engines}")
    if not (math.isfinite(options.think_ms) and options.think_ms >= 0):
        raise UsageError(f"--think-ms must be 0 (no think time) or more, got {options.think_ms:g}")
    if options.own_core and len(os.sched_getaffinity(0)) < 2:
        raise UsageError("--own-core needs at least 2 CPUs to run on")
    if options.classify_tokens <= INTERACTIVE_MAX_PROMPT or options.classify_repeats < 1:
        raise UsageError(
            f"--classify-tokens must exceed {INTERACTIVE_MAX_PROMPT} (a batch-lane prompt)"
        )


# -- configuration ------------------------------------------------------------------------


def pool_documents(
    endpoint: str, batch_context: int, max_concurrent: int = 1024
) -> list[dict[str, Any]]:
    """An interactive pool capped at 4k prompts and a batch pool with `batch_context` tokens."""

    def pool(name: str, lane: str, minimum: int, maximum: int, context: int) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {
                "lane": lane,
                "model": MODEL,
                "engine": {"kind": "simulator"},
                "routing": {"minPromptTokens": minimum, "maxPromptTokens": maximum},
                "prefill": {"tokenBudget": 8192, "chunkSize": 1024},
                "limits": {"maxContextTokens": context, "maxConcurrentRequests": max_concurrent},
            },
            "status": {"endpoints": [endpoint]},
        }

    return [
        pool("interactive", "interactive", 0, INTERACTIVE_MAX_PROMPT, 8192),
        pool("batch", "batch", INTERACTIVE_MAX_PROMPT + 1, batch_context - 1024, batch_context),
    ]


def gateway_config(endpoints: Sequence[str]) -> list[dict[str, Any]]:
    """A bench gateway's documents: both pools on every one of `endpoints`, and a queue no
    level of concurrency fills or outwaits."""
    queue = {"maxWaiting": 100_000, "timeoutMillis": 120_000}
    settings = {"apiVersion": API_VERSION, "kind": "GatewayConfig", "spec": {"queue": queue}}
    pools = pool_documents(endpoints[0], 8192 * 16)
    for pool in pools:
        pool["status"]["endpoints"] = list(endpoints)
    return [settings, *pools]
