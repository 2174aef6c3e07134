"""The seed experiment as data: the workload and the five cluster configurations.

Each pool is an InferencePool document and each configuration carries the gateway's picking
settings. Virtual mode (`laneway bench seed --mode virtual`) routes with them through the
routing library in the discrete-event runner; live mode starts one `laneway sim` per replica
with `SimPool.engine` as its flags and configures the real gateway with the same documents
and settings, replaying the same workload.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from laneway.api import API_VERSION, KIND, InferencePool, Lane, parse_pool
from laneway.api.lending import LendingSpec
from laneway.ledger import LedgerSettings
from laneway.routing.picker import PickingSettings
from laneway.simulator.cost import PrefillChunk, StepWork, step_duration
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import SchedulerConfig

CONFIG_NAMES = ("unified-full", "unified-chunked", "split", "laneway", "lending")
PUBLIC_MODEL = "llama3-8b"  # the model name clients ask for; every pool answers it
# The seed experiment's picking profile (what live mode has always configured): prompt
# tokens awaiting their first token first, requests in flight second. On this workload it
# beats the gateway's default profile, whose scraped queue-depth and KV scores lag the
# bursts (docs/BENCHMARKS.md has both).
SEED_PICKING = PickingSettings(
    weights={
        "queueDepth": 0,
        "kvCacheUsage": 0,
        "inFlightRequests": 1,
        "prefillTokens": 4,
        "ttftSlo": 0,
        "prefixAffinity": 0,  # the seed's prompts share no prefixes
        "sessionHash": 0,
    }
)
# How often the gateway reads each engine's /metrics in the seed experiment (live mode's
# GatewayConfig), and so how old the engine gauges the virtual runner ranks by may be.
SCRAPE_INTERVAL_S = 0.25

# The seed's lane rule: short (< 2k tokens) to the realtime cluster, capped at 4k context.
REALTIME_MAX_PROMPT = 2048
REALTIME_MAX_CONTEXT = 4096
# Long enough for the 128k documents the seed sends to the batch pool.
LONG_CONTEXT = 131072
# The interactive SLO the seed states: TTFT < 300 ms, TBT < 30 ms.
TTFT_SLO_S = 0.300
TBT_SLO_S = 0.030


@dataclass(frozen=True)
class SeedScenario:
    gpus: int = 8
    sessions: int = 200
    long_requests: int = 20
    long_tokens: int = 65536
    long_output_tokens: int = 512
    duration_s: float = 60.0  # sessions start new turns until then; the run drains after
    burst_at_s: float = 5.0  # when all long requests arrive at once
    prompt_tokens: tuple[int, int] = (200, 1500)
    output_tokens: tuple[int, int] = (50, 250)
    think_time_s: tuple[float, float] = (1.0, 5.0)
    session_start_spread_s: float = 2.0  # sessions begin uniformly within this window
    seed: int = 0


def scenario_problems(scenario: SeedScenario) -> list[str]:
    """What makes `scenario` unusable, as sentences naming the flag; empty if fine."""
    problems = []
    if scenario.gpus < 2:
        problems.append("--gpus must be at least 2 (the split configurations need two lanes)")
    if scenario.sessions < 0:
        problems.append("--sessions must not be negative")
    if scenario.long_requests < 0:
        problems.append("--long-requests must not be negative")
    if not 1 <= scenario.long_tokens <= LONG_CONTEXT - scenario.long_output_tokens:
        problems.append(
            f"--long-tokens must be between 1 and {LONG_CONTEXT - scenario.long_output_tokens}"
        )
    if not scenario.duration_s > 0:
        problems.append("--duration must be above 0")
    if scenario.sessions == 0 and scenario.long_requests == 0:
        problems.append("nothing to run: --sessions and --long-requests are both 0")
    return problems


@dataclass(frozen=True)
class SimPool:
    name: str
    lane: Lane
    max_prompt_tokens: int | None  # None: up to the context cap
    max_context_tokens: int
    replicas: int
    engine: SchedulerConfig
    min_prompt_tokens: int = 0
    lending: LendingSpec | None = None  # an interactive pool that lends idle replicas

    @property
    def served_model(self) -> str:
        return f"{PUBLIC_MODEL}-{self.name}"

    def document(self, endpoints: Sequence[str], namespace: str = "seed") -> dict[str, Any]:
        """The InferencePool the gateway is configured with, its engines at `endpoints`."""
        engine = self.engine
        routing: dict[str, Any] = {
            "models": [PUBLIC_MODEL],
            "minPromptTokens": self.min_prompt_tokens,
        }
        if self.max_prompt_tokens is not None:
            routing["maxPromptTokens"] = self.max_prompt_tokens
        document: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.name, "namespace": namespace},
            "spec": {
                "lane": self.lane.value,
                "model": "meta-llama/Meta-Llama-3-8B-Instruct",
                "servedModelName": self.served_model,
                "engine": {"kind": "simulator"},
                "replicas": self.replicas,
                "routing": routing,
                "prefill": {
                    "chunkedPrefill": engine.kind == "chunked",
                    "chunkSize": min(engine.chunk_size, engine.max_context),
                    "tokenBudget": engine.token_budget,
                    "maxPartialPrefills": engine.max_partial_prefills,
                },
                "limits": {
                    "maxContextTokens": self.max_context_tokens,
                    "maxConcurrentRequests": engine.max_num_seqs,
                },
                # The gateway sends a `priority` only to a pool that schedules by it.
                "scheduling": {"policy": engine.scheduling_policy.value},
            },
            "status": {"endpoints": list(endpoints)},
        }
        if self.lending is not None:
            document["spec"]["lending"] = self.lending.model_dump(mode="json", by_alias=True)
        return document

    def inference_pool(self, endpoints: Sequence[str]) -> InferencePool:
        return parse_pool(self.document(endpoints))

    def sim_args(self, profile: str, time_scale: float) -> list[str]:
        """`laneway sim` flags for one of this pool's engines, on a free loopback port."""
        engine = self.engine
        return [
            "--host", "127.0.0.1", "--port", "0",
            "--model", self.served_model,
            "--profile", profile,
            "--scheduler", engine.kind,
            "--token-budget", str(engine.token_budget),
            "--chunk-size", str(engine.chunk_size),
            "--max-context", str(engine.max_context),
            "--max-num-seqs", str(engine.max_num_seqs),
            "--max-partial-prefills", str(engine.max_partial_prefills),
            "--scheduling-policy", engine.scheduling_policy.value,
            "--time-scale", f"{time_scale:g}",
        ]  # fmt: skip


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    summary: str
    pools: tuple[SimPool, ...]
    # How endpoints are ranked within a pool; live mode configures the gateway with the
    # same profile, so both modes describe the policy the gateway runs.
    picking: PickingSettings = field(default_factory=lambda: SEED_PICKING)
    # A lending pool lends one more replica per this long of chat demand below its replicas
    # (the gateway's `spec.lending.lendAfterMillis`); moot where no pool lends.
    lend_after_s: float = LedgerSettings.lend_after_s

    @property
    def lends(self) -> bool:
        return any(pool.lending is not None for pool in self.pools)

    @property
    def gpus(self) -> int:
        return sum(pool.replicas for pool in self.pools)


# A lane planned to run its prefill capacity at this fraction at peak demand: the usual
# capacity-planning headroom, which keeps queueing delay to a few steps.
TARGET_UTILIZATION = 0.7
INTERACTIVE_DECODE_BATCH = 64  # the decode batch an interactive step is priced with


# The seed article's chunked settings for long prompts: 2,048-token step budget, 1,024-token
# chunks; vLLM V1 puts no cap on prompts left part-prefilled; 64 (the API maximum) is none here.
CHUNKED_LONG = SchedulerConfig(
    kind="chunked",
    token_budget=2048,
    chunk_size=1024,
    max_num_seqs=256,
    max_partial_prefills=64,
    max_context=LONG_CONTEXT,
)


# One engine configuration for both roles, so a replica serves either lane: chunked prefill
# within a 768-token step budget (a mixed step stays within the TBT SLO on an H200, as
# `tbt_token_budget` finds) and the batch lane's context. vLLM `--max-model-len 131072
# --max-num-batched-tokens 768 --long-prefill-token-threshold 768 --max-num-seqs 64`;
# SGLang `--context-length 131072 --chunked-prefill-size 768 --max-running-requests 64`.
LENDING_ENGINE = SchedulerConfig(
    kind="chunked",
    token_budget=768,
    chunk_size=768,
    max_num_seqs=64,
    max_partial_prefills=64,
    max_context=LONG_CONTEXT,
)
# The chat pool's lending (`spec.lending`): idle replicas go to the batch pool, one always
# kept for chat, a quarter of each chat replica's capacity kept free when packing.
LENDING = LendingSpec(borrower="batch", keep_replicas=1, headroom=0.25)


def slo_interactive_engine(budget: int) -> SchedulerConfig:
    """An interactive replica's engine: chunked within `budget` (`tbt_token_budget`'s), the
    realtime context cap."""
    return SchedulerConfig(
        kind="chunked",
        token_budget=budget,
        chunk_size=budget,
        max_num_seqs=INTERACTIVE_DECODE_BATCH,
        max_partial_prefills=INTERACTIVE_DECODE_BATCH,
        max_context=REALTIME_MAX_CONTEXT,
    )


def tbt_token_budget(profile: Profile, decode_batch: int, context_tokens: int) -> int:
    """The largest step budget (a multiple of 128) that keeps a mixed step within the TBT SLO.

    The step priced is the worst the interactive lane sees: `decode_batch` decodes of
    `context_tokens` each plus one prefill chunk filling the rest of the budget, attending
    to a prompt's worth of context. This is Sarathi-Serve's rule for choosing the budget.
    """
    budget = 128
    while budget + 128 <= REALTIME_MAX_CONTEXT:
        candidate = budget + 128
        if _mixed_step_s(profile, candidate, decode_batch, context_tokens) > TBT_SLO_S:
            break
        budget = candidate
    return budget


def _mixed_step_s(profile: Profile, budget: int, decode_batch: int, context_tokens: int) -> float:
    chunk = PrefillChunk(
        tokens=budget - decode_batch, context_before=context_tokens, completes_prompt=True
    )
    work = StepWork(
        prefill=(chunk,),
        decode_count=decode_batch,
        decode_context_tokens=decode_batch * context_tokens,
    )
    return step_duration(profile, work)


def interactive_replicas(scenario: SeedScenario, profile: Profile, budget: int) -> int:
    """GPUs the interactive lane needs for the scenario's peak prompt rate, the rest go to batch.

    Peak demand: every session sends a mean prompt per mean think time (an upper bound, as
    it ignores the time spent generating). Capacity of one replica: the prefill tokens of a
    full mixed step per step time. The lane runs at TARGET_UTILIZATION of its capacity.
    """
    if profile.zero_service_time:
        return scenario.gpus // 2
    mean_prompt = sum(scenario.prompt_tokens) / 2
    mean_think = sum(scenario.think_time_s) / 2
    demand = scenario.sessions * mean_prompt / mean_think
    step_s = _mixed_step_s(profile, budget, INTERACTIVE_DECODE_BATCH, REALTIME_MAX_PROMPT)
    capacity = (budget - INTERACTIVE_DECODE_BATCH) / step_s
    needed = math.ceil(demand / (TARGET_UTILIZATION * capacity))
    return min(max(needed, 1), scenario.gpus - 1)


def seed_configs(scenario: SeedScenario, profile: Profile) -> tuple[ClusterConfig, ...]:
    """The five configurations of the seed experiment on the scenario's GPUs."""
    gpus = scenario.gpus
    split_realtime = gpus // 2

    # vLLM without chunked prefill needs a budget that holds the longest prompt
    # (its default max_num_batched_tokens is max(max_model_len, 2048)).
    full_long = SchedulerConfig(
        kind="full",
        token_budget=LONG_CONTEXT,
        chunk_size=LONG_CONTEXT,
        max_num_seqs=256,
        max_partial_prefills=1,
        max_context=LONG_CONTEXT,
    )
    full_realtime = SchedulerConfig(
        kind="full",
        token_budget=REALTIME_MAX_CONTEXT,
        chunk_size=REALTIME_MAX_CONTEXT,
        max_num_seqs=256,
        max_partial_prefills=1,
        max_context=REALTIME_MAX_CONTEXT,
    )

    budget = tbt_token_budget(profile, INTERACTIVE_DECODE_BATCH, REALTIME_MAX_PROMPT)
    slo_interactive = slo_interactive_engine(budget)
    laneway_interactive = interactive_replicas(scenario, profile, budget)
    return (
        ClusterConfig(
            name="unified-full",
            summary=f"{gpus} mixed replicas, whole-prompt prefill",
            pools=(unified_pool(gpus, full_long),),
        ),
        ClusterConfig(
            name="unified-chunked",
            summary=f"{gpus} mixed replicas, chunked prefill (2048 budget, 1024 chunks)",
            pools=(unified_pool(gpus, CHUNKED_LONG),),
        ),
        ClusterConfig(
            name="split",
            summary=f"{split_realtime} realtime (4k cap, whole-prompt prefill) + "
            f"{gpus - split_realtime} batch (chunked prefill)",
            pools=(
                realtime_pool(split_realtime, full_realtime),
                batch_pool(gpus - split_realtime, CHUNKED_LONG),
            ),
        ),
        ClusterConfig(
            name="laneway",
            summary=f"{laneway_interactive} interactive (4k cap, chunked, {budget}-token "
            f"TBT-SLO budget) + {gpus - laneway_interactive} batch (chunked prefill)",
            pools=(
                realtime_pool(laneway_interactive, slo_interactive),
                batch_pool(gpus - laneway_interactive, CHUNKED_LONG),
            ),
        ),
        ClusterConfig(
            name="lending",
            summary=f"{laneway_interactive} chat lending idle replicas to "
            f"{gpus - laneway_interactive} batch, one engine config (768 budget, 128k context)",
            pools=shared_engine_pools(gpus, laneway_interactive, LENDING),
        ),
    )


def shared_engine_pools(
    gpus: int, chat: int, lending: LendingSpec | None = None
) -> tuple[SimPool, SimPool]:
    """`chat` realtime and `gpus - chat` batch replicas, all of `LENDING_ENGINE`: the
    realtime pool takes the batch lane's context, so it may lend its replicas."""
    realtime = dataclasses.replace(
        realtime_pool(chat, LENDING_ENGINE), max_context_tokens=LONG_CONTEXT, lending=lending
    )
    return realtime, batch_pool(gpus - chat, LENDING_ENGINE)


def unified_pool(replicas: int, engine: SchedulerConfig) -> SimPool:
    return SimPool(
        name="unified",
        lane=Lane.INTERACTIVE,
        max_prompt_tokens=None,
        max_context_tokens=LONG_CONTEXT,
        replicas=replicas,
        engine=engine,
    )


def realtime_pool(replicas: int, engine: SchedulerConfig) -> SimPool:
    return SimPool(
        name="realtime",
        lane=Lane.INTERACTIVE,
        max_prompt_tokens=REALTIME_MAX_PROMPT,
        max_context_tokens=REALTIME_MAX_CONTEXT,
        replicas=replicas,
        engine=engine,
    )


def batch_pool(replicas: int, engine: SchedulerConfig) -> SimPool:
    return SimPool(
        name="batch",
        lane=Lane.BATCH,
        max_prompt_tokens=None,
        max_context_tokens=LONG_CONTEXT,
        replicas=replicas,
        engine=engine,
    )
