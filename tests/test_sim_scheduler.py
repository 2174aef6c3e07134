"""Schedulers and the engine core: plans for hand-built states, and invariants under load."""

from __future__ import annotations

import dataclasses
import random

import pytest
from support.profiles import small_kv_profile

from laneway.api import SchedulingPolicy
from laneway.simulator.engine import EngineCore, RequestRejected
from laneway.simulator.profiles import GIB, PROFILES
from laneway.simulator.scheduler import (
    ChunkedScheduler,
    FullScheduler,
    RequestState,
    SchedulerConfig,
    StepPlan,
    blocks_for,
    config_problems,
)

H200 = PROFILES["h200-llama3-8b"]
PLENTY_OF_KV = 1_000_000


def decoding(rid: str, prompt: int = 100, generated: int = 1) -> RequestState:
    return RequestState(
        request_id=rid,
        prompt_tokens=prompt,
        max_output_tokens=50,
        computed_prompt_tokens=prompt,
        generated_tokens=generated,
    )


def prefilling(rid: str, prompt: int, computed: int) -> RequestState:
    return RequestState(
        request_id=rid, prompt_tokens=prompt, max_output_tokens=50, computed_prompt_tokens=computed
    )


def waiting(rid: str, prompt: int, output: int = 50) -> RequestState:
    return RequestState(request_id=rid, prompt_tokens=prompt, max_output_tokens=output)


CHUNKED = SchedulerConfig("chunked", token_budget=2048, chunk_size=1024, max_num_seqs=8,
                          max_partial_prefills=1, max_context=131072)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "config", "queued", "running", "free_blocks", "expected"),
    [
        (
            "decodes first, then a long prompt's first chunk capped by the chunk size",
            CHUNKED,
            [waiting("long", 65536)],
            [decoding("d1"), decoding("d2"), decoding("d3")],
            PLENTY_OF_KV,
            StepPlan(admitted=("long",), prefill=(("long", 1024),), decode=("d1", "d2", "d3")),
        ),
        (
            "the running partial prefill goes before waiting prompts",
            CHUNKED,
            [waiting("short", 600)],
            [prefilling("long", 65536, 4096)],
            PLENTY_OF_KV,
            StepPlan(admitted=("short",), prefill=(("long", 1024), ("short", 600))),
        ),
        (
            "a prompt that would stay part-done waits for the partial limit; a shorter one passes",
            CHUNKED,
            [waiting("big", 1500), waiting("small", 500)],
            [prefilling("long", 65536, 4096)],
            PLENTY_OF_KV,
            StepPlan(admitted=("small",), prefill=(("long", 1024), ("small", 500))),
        ),
        (
            "the budget runs out: the last prompt gets what is left, as the one partial",
            dataclasses.replace(CHUNKED, chunk_size=2048),
            [waiting("a", 1500), waiting("b", 1500)],
            [],
            PLENTY_OF_KV,
            StepPlan(admitted=("a", "b"), prefill=(("a", 1500), ("b", 548))),
        ),
        (
            "one partial allowed: the second long prompt waits, a short one behind it runs",
            CHUNKED,
            [waiting("a", 3000), waiting("b", 3000), waiting("c", 10)],
            [],
            PLENTY_OF_KV,
            StepPlan(admitted=("a", "c"), prefill=(("a", 1024), ("c", 10))),
        ),
        (
            "KV for the head of the queue is missing: nobody behind it jumps ahead",
            CHUNKED,
            [waiting("needs-much", 8000), waiting("needs-little", 100)],
            [decoding("d1")],
            blocks_for(8050) - 1,
            StepPlan(decode=("d1",)),
        ),
        (
            "seats are full at max_num_seqs",
            dataclasses.replace(CHUNKED, max_num_seqs=2),
            [waiting("late", 100)],
            [decoding("d1"), decoding("d2")],
            PLENTY_OF_KV,
            StepPlan(decode=("d1", "d2")),
        ),
    ],
)
def test_chunked_plans(
    case: str,
    config: SchedulerConfig,
    queued: list[RequestState],
    running: list[RequestState],
    free_blocks: int,
    expected: StepPlan,
) -> None:
    assert ChunkedScheduler(config).schedule(queued, running, free_blocks) == expected, case


FULL = SchedulerConfig("full", token_budget=4096, chunk_size=4096, max_num_seqs=8,
                       max_partial_prefills=1, max_context=131072)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "queued", "running", "expected"),
    [
        (
            "a waiting prompt stops every decode for one step (prefill-prioritized)",
            [waiting("p", 1000)],
            [decoding("d1"), decoding("d2")],
            StepPlan(admitted=("p",), prefill=(("p", 1000),)),
        ),
        (
            "prompts batch up to the budget, whole",
            [waiting("a", 3000), waiting("b", 1000), waiting("c", 500)],
            [],
            StepPlan(admitted=("a", "b"), prefill=(("a", 3000), ("b", 1000))),
        ),
        (
            "a prompt longer than the budget still runs whole, alone",
            [waiting("long", 65536), waiting("b", 100)],
            [],
            StepPlan(admitted=("long",), prefill=(("long", 65536),)),
        ),
        ("nothing waiting: everyone decodes", [], [decoding("d1")], StepPlan(decode=("d1",))),
    ],
)
def test_full_plans(
    case: str, queued: list[RequestState], running: list[RequestState], expected: StepPlan
) -> None:
    assert FullScheduler(FULL).schedule(queued, running, PLENTY_OF_KV) == expected, case


def test_config_problems_name_the_flag_to_change() -> None:
    assert config_problems(CHUNKED) == []
    assert any(
        "chunk-size 4096 exceeds token-budget 2048" in p
        for p in config_problems(dataclasses.replace(CHUNKED, chunk_size=4096))
    )
    assert any(
        "max-num-seqs" in p
        for p in config_problems(dataclasses.replace(CHUNKED, token_budget=4, chunk_size=4))
    )
    assert any(
        "token-budget" in p for p in config_problems(dataclasses.replace(CHUNKED, token_budget=0))
    )


def drive_to_completion(
    core: EngineCore, arrivals: list[tuple[int, int, int]]
) -> tuple[dict[str, int], float]:
    """Submit `arrivals` (step index, prompt, output) and step until idle, checking each step.

    Returns tokens received per request and the highest KV usage seen.
    """
    tokens: dict[str, int] = {}
    peak_kv = 0.0
    pending = sorted(arrivals)
    assert pending == arrivals, "request ids follow the order of `arrivals`"
    step = 0
    next_arrival = 0
    while next_arrival < len(pending) or core.has_work:
        while next_arrival < len(pending) and pending[next_arrival][0] <= step:
            _, prompt, output = pending[next_arrival]
            core.submit(f"r{next_arrival}", prompt, output)
            next_arrival += 1
        decoding_before = {s.request_id for s in core.running if s.prefill_done}
        outcome = core.step()
        step += 1
        assert step < 100_000, "the engine stopped making progress"
        if outcome is None:
            assert not core.has_work
            continue
        config = core.config
        assert core.kv_used_blocks <= core.kv_capacity_blocks
        assert len(core.running) <= config.max_num_seqs
        scheduled = outcome.work.decode_count + sum(c.tokens for c in outcome.work.prefill)
        if config.kind == "chunked":
            assert scheduled <= config.token_budget
            assert all(c.tokens <= config.chunk_size for c in outcome.work.prefill)
            # Every request that was decoding got its token this step.
            assert decoding_before <= set(outcome.tokens)
        else:
            assert outcome.work.decode_count == 0 or not outcome.work.prefill
        for rid in outcome.tokens:
            tokens[rid] = tokens.get(rid, 0) + 1
        peak_kv = max(peak_kv, core.kv_usage)
    return tokens, peak_kv


@pytest.mark.parametrize("kind", ["chunked", "full"])
def test_every_request_finishes_within_kv_and_budget(kind: str) -> None:
    rng = random.Random(7)
    arrivals = [
        (rng.randint(0, 400), rng.randint(10, 3000), rng.randint(1, 60)) for _ in range(150)
    ]
    arrivals += [
        (rng.randint(0, 400), rng.randint(9000, 15000), rng.randint(1, 20)) for _ in range(6)
    ]
    config = SchedulerConfig(
        kind=kind,  # type: ignore[arg-type]
        token_budget=1024 if kind == "chunked" else 16384,
        chunk_size=512,
        max_num_seqs=32,
        max_partial_prefills=2,
        max_context=16384,
    )
    core = EngineCore(small_kv_profile(40_000), config)
    arrivals.sort()
    tokens, peak_kv = drive_to_completion(core, arrivals)
    assert peak_kv > 0.8, "the workload should press on the KV cache"
    assert len(tokens) == len(arrivals)
    for index, (_, _, output) in enumerate(arrivals):
        assert tokens[f"r{index}"] == output
    assert core.kv_used_blocks == 0


def test_requests_that_can_never_fit_are_rejected_up_front() -> None:
    core = EngineCore(small_kv_profile(10_000), dataclasses.replace(CHUNKED, max_context=16384))
    with pytest.raises(RequestRejected, match="maximum context length is 16384"):
        core.submit("too-long", 16000, 1000)
    with pytest.raises(RequestRejected, match="KV cache"):
        core.submit("too-big-for-kv", 12000, 10)
    with pytest.raises(RequestRejected):
        core.submit("empty", 0, 10)


def test_abort_frees_kv_and_forgets_the_request() -> None:
    core = EngineCore(H200, CHUNKED)
    core.submit("a", 3000, 10)
    core.submit("b", 100, 10)
    assert core.step() is not None
    assert core.kv_used_blocks > 0
    core.abort("a")
    core.abort("b")
    assert core.kv_used_blocks == 0
    assert not core.has_work
    assert core.step() is None


def test_memory_reserve_leaves_the_rest_for_kv() -> None:
    profile = small_kv_profile(40_000)
    assert 40_000 <= profile.kv_capacity_tokens <= 40_001
    assert H200.kv_capacity_tokens > PROFILES["h100-llama3-8b"].kv_capacity_tokens > 0
    assert H200.kv_capacity_tokens * H200.model.kv_bytes_per_token < 141e9 - 16e9
    assert GIB == 1024**3


# -- priority scheduling (vLLM --scheduling-policy priority) ----------------------------

# A 600-token step with 512-token chunks and one prompt left part-done at most (the V0
# rule); `AS_V1` lifts the partial limit as vLLM V1 does.
SMALL_STEP = SchedulerConfig("chunked", token_budget=600, chunk_size=512, max_num_seqs=8,
                             max_partial_prefills=1, max_context=8192)  # fmt: skip
PRIORITY = dataclasses.replace(SMALL_STEP, scheduling_policy=SchedulingPolicy.PRIORITY)
AS_V1 = dataclasses.replace(PRIORITY, max_partial_prefills=64)


def chunks_of(core: EngineCore) -> list[tuple[int, int]]:
    """One step's prefill chunks as (tokens, context before), in plan order."""
    outcome = core.step()
    assert outcome is not None
    return [(chunk.tokens, chunk.context_before) for chunk in outcome.work.prefill]


def test_fcfs_admits_in_arrival_order_whatever_the_priority_field() -> None:
    core = EngineCore(H200, SMALL_STEP)
    core.submit("document", 3000, 10)
    core.submit("chat", 500, 10)
    # The document arrived first and takes a 512-token chunk; the chat prompt would be left
    # part-done by the 88 tokens that remain, and one partial is already taken, so it waits.
    assert chunks_of(core) == [(512, 0)]
    assert [seq.request_id for seq in core.waiting] == ["chat"]


def test_priority_admits_the_more_urgent_request_first() -> None:
    core = EngineCore(H200, PRIORITY)
    core.submit("document", 3000, 10, priority=1)
    core.submit("chat", 500, 10, priority=0)
    # Chat first (500 tokens, its whole prompt), then the document gets the 100 left.
    assert chunks_of(core) == [(500, 0), (100, 0)]
    assert [seq.request_id for seq in core.running] == ["chat", "document"]


def test_priority_keeps_arrival_order_within_a_level() -> None:
    core = EngineCore(H200, PRIORITY)
    for name, priority in [("b1", 1), ("i1", 0), ("b2", 1), ("i2", 0), ("u", -1)]:
        core.submit(name, 100, 10, priority=priority)
    assert [seq.request_id for seq in core.waiting] == ["u", "i1", "i2", "b1", "b2"]


def test_a_running_low_priority_prefill_keeps_its_capped_chunk() -> None:
    # vLLM schedules RUNNING requests before WAITING ones whatever their priority: once a
    # document is admitted, each step gives it min(left, threshold, budget) first, and a
    # more urgent newcomer gets what the step has left.
    core = EngineCore(H200, AS_V1)
    core.submit("document", 3000, 10, priority=1)
    assert chunks_of(core) == [(512, 0)]
    core.submit("chat", 500, 10, priority=0)
    assert chunks_of(core) == [(512, 512), (88, 0)]
    assert chunks_of(core) == [(512, 1024), (88, 88)]


def test_a_priority_without_priority_scheduling_is_refused_as_vllm_does() -> None:
    core = EngineCore(H200, SMALL_STEP)
    with pytest.raises(RequestRejected, match="Got priority 1 but Priority scheduling is not"):
        core.submit("document", 3000, 10, priority=1)
    assert not core.waiting
