"""Iteration-level schedulers: which tokens of which requests the next step computes.

One rule, as in vLLM V1: a request's computed tokens catch up with its tokens. A prompt's
prefill is the catching up of its prompt tokens; a decode is one more token. A scheduler
only decides; it returns a frozen `StepPlan`, and the engine applies it in one place.

- `full`: prefill-prioritized, no chunking (vLLM V0 without chunked prefill, SGLang with
  chunking off): when a waiting prompt can be admitted, the step prefills whole prompts
  only, and running decodes wait for it; otherwise the step decodes every running request.
- `chunked`: vLLM V1 / Sarathi-Serve: every running decode gets its token first, then the
  rest of the token budget goes to prefill chunks of min(still needed, chunk size, budget).
  The chunk size is vLLM's `--long-prefill-token-threshold` (`Scheduler.schedule` caps every
  request's new tokens at it, running and waiting alike) and SGLang's `--chunked-prefill-size`.

Both take `waiting` in queue order, which the engine keeps: arrival order under the `fcfs`
policy, (priority, arrival) under `priority` (vLLM's `--scheduling-policy priority`, whose
waiting queue is a heap on that key; lower values first). Priority orders admission only:
running requests are served every step whatever their priority, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from laneway.api import SchedulingPolicy
from laneway.simulator.prefix_cache import DEFAULT_BLOCK_SIZE, NO_HIT, PrefixHit

KV_BLOCK_TOKENS = DEFAULT_BLOCK_SIZE

SchedulerKind = Literal["full", "chunked"]
SCHEDULER_KINDS: tuple[SchedulerKind, ...] = ("full", "chunked")


@dataclass
class RequestState:
    """One request's progress inside an engine; mutated only by the engine's apply step."""

    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    computed_prompt_tokens: int = 0
    generated_tokens: int = 0
    block_hashes: tuple[int, ...] = ()  # the prompt's full blocks, chained; () caches nothing
    held_blocks: list[int] = field(default_factory=list)  # cached blocks it holds, in order
    private_blocks: int = 0  # blocks of its own that are not (or not yet) in the cache
    priority: int = 0  # the request's `priority`; lower is admitted first under `priority`

    @property
    def prefill_remaining(self) -> int:
        return self.prompt_tokens - self.computed_prompt_tokens

    @property
    def prefill_done(self) -> bool:
        return self.computed_prompt_tokens == self.prompt_tokens

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV a decode step reads."""
        return self.computed_prompt_tokens + self.generated_tokens

    @property
    def kv_blocks(self) -> int:
        """Blocks reserved at admission for the whole request (prompt and every output)."""
        return blocks_for(self.prompt_tokens + self.max_output_tokens)


def blocks_for(tokens: int) -> int:
    return -(-tokens // KV_BLOCK_TOKENS)


# What the prefix cache holds of a waiting request's prompt (a pure query of the engine's).
PrefixLookup = Callable[[RequestState], PrefixHit]


def no_prefix_cache(_: RequestState) -> PrefixHit:
    return NO_HIT


@dataclass(frozen=True)
class SchedulerConfig:
    kind: SchedulerKind = "chunked"
    token_budget: int = 2048  # tokens per step (vLLM --max-num-batched-tokens)
    chunk_size: int = 1024  # most prompt tokens one request gets per step
    max_num_seqs: int = 256  # running requests at most
    max_partial_prefills: int = 1  # prompts left part-prefilled after a step, at most
    max_context: int = 8192  # prompt + output tokens per request, at most
    # Automatic prefix caching: on by default in vLLM V1 (--no-enable-prefix-caching turns
    # it off) and in SGLang (its radix cache; --disable-radix-cache).
    prefix_caching: bool = True
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS  # the waiting queue's order


def config_problems(config: SchedulerConfig) -> list[str]:
    """What makes `config` unusable, each as a sentence saying what to change; empty if fine."""
    problems: list[str] = []
    if config.kind not in SCHEDULER_KINDS:
        problems.append(f"scheduler must be one of {', '.join(SCHEDULER_KINDS)}")
    policies = [policy.value for policy in SchedulingPolicy]
    if config.scheduling_policy not in policies:
        problems.append(f"scheduling-policy must be one of {', '.join(policies)}")
    for name in ("token_budget", "chunk_size", "max_num_seqs", "max_partial_prefills"):
        if getattr(config, name) < 1:
            problems.append(f"{name.replace('_', '-')} must be at least 1")
    if config.max_context < 2:
        problems.append("max-context must be at least 2 (one prompt and one output token)")
    if config.kind == "chunked" and config.chunk_size > config.token_budget:
        problems.append(
            f"chunk-size {config.chunk_size} exceeds token-budget {config.token_budget}; "
            "a chunk must fit in one step"
        )
    if config.token_budget < config.max_num_seqs and config.kind == "chunked":
        problems.append(
            f"token-budget {config.token_budget} is below max-num-seqs {config.max_num_seqs}; "
            "every running decode needs a token each step"
        )
    return problems


@dataclass(frozen=True)
class StepPlan:
    admitted: tuple[str, ...] = ()  # waiting request ids that start running this step
    prefill: tuple[tuple[str, int], ...] = ()  # request id -> prompt tokens computed this step
    decode: tuple[str, ...] = ()  # request ids that each generate one token
    cached: tuple[tuple[str, PrefixHit], ...] = ()  # admitted id -> its prefix-cache hit

    @property
    def scheduled_tokens(self) -> int:
        return len(self.decode) + sum(tokens for _, tokens in self.prefill)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler(Protocol):
    @property
    def config(self) -> SchedulerConfig: ...

    def schedule(
        self,
        waiting: Sequence[RequestState],
        running: Sequence[RequestState],
        free_kv_blocks: int,
        lookup: PrefixLookup = no_prefix_cache,
    ) -> StepPlan:
        """Plan the next step; `waiting` is in queue order, `running` in admission order.

        A waiting prompt's cached blocks are not prefilled again: its first chunk starts
        after them, and it needs KV only for its other blocks and for the cached blocks it
        takes out of the free pool (vLLM's `get_num_blocks_to_allocate`).
        """
        ...


@dataclass(frozen=True)
class ChunkedScheduler:
    config: SchedulerConfig

    def schedule(
        self,
        waiting: Sequence[RequestState],
        running: Sequence[RequestState],
        free_kv_blocks: int,
        lookup: PrefixLookup = no_prefix_cache,
    ) -> StepPlan:
        budget = self.config.token_budget

        # Running decodes first: a decode is never delayed by anyone's prefill.
        decode = tuple(seq.request_id for seq in running if seq.prefill_done)[:budget]
        budget -= len(decode)

        # Then prompts already being prefilled, oldest first.
        prefill: list[tuple[str, int]] = []
        left_partial = 0
        for seq in running:
            if seq.prefill_done:
                continue
            grant = min(seq.prefill_remaining, self.config.chunk_size, budget)
            if grant:
                prefill.append((seq.request_id, grant))
                budget -= grant
            left_partial += grant < seq.prefill_remaining

        # Then admit waiting prompts while budget, seats and KV last.
        admitted: list[str] = []
        cached: list[tuple[str, PrefixHit]] = []
        seats = self.config.max_num_seqs - len(running)
        for seq in waiting:
            if budget == 0 or seats == 0:
                break
            hit = lookup(seq)
            needed_blocks = seq.kv_blocks - hit.blocks + hit.evictable
            if needed_blocks > free_kv_blocks:
                # KV goes to the head of the queue in order, so a big request cannot starve.
                break
            remaining = seq.prompt_tokens - hit.blocks * KV_BLOCK_TOKENS
            grant = min(remaining, self.config.chunk_size, budget)
            leaves_partial = grant < remaining
            if leaves_partial and left_partial >= self.config.max_partial_prefills:
                # A prompt that would stay part-done must wait, but a shorter one that
                # finishes in this step may pass it (vLLM's partial-prefill limits).
                continue
            admitted.append(seq.request_id)
            prefill.append((seq.request_id, grant))
            if hit.blocks:
                cached.append((seq.request_id, hit))
            budget -= grant
            seats -= 1
            free_kv_blocks -= needed_blocks
            left_partial += leaves_partial

        plan = StepPlan(
            admitted=tuple(admitted), prefill=tuple(prefill), decode=decode, cached=tuple(cached)
        )
        assert budget >= 0
        assert plan.scheduled_tokens <= self.config.token_budget
        assert all(0 < tokens <= self.config.chunk_size for _, tokens in plan.prefill)
        return plan


@dataclass(frozen=True)
class FullScheduler:
    config: SchedulerConfig

    def schedule(
        self,
        waiting: Sequence[RequestState],
        running: Sequence[RequestState],
        free_kv_blocks: int,
        lookup: PrefixLookup = no_prefix_cache,
    ) -> StepPlan:
        # Prefill first: admit whole prompts in order while KV, seats and budget allow;
        # the first admissible prompt always goes, however long (the budget cannot split it).
        admitted: list[str] = []
        prefill: list[tuple[str, int]] = []
        cached: list[tuple[str, PrefixHit]] = []
        budget = self.config.token_budget
        seats = self.config.max_num_seqs - len(running)
        for seq in waiting:
            hit = lookup(seq)
            needed_blocks = seq.kv_blocks - hit.blocks + hit.evictable
            if seats == 0 or needed_blocks > free_kv_blocks:
                break
            remaining = seq.prompt_tokens - hit.blocks * KV_BLOCK_TOKENS
            if prefill and remaining > budget:
                break
            admitted.append(seq.request_id)
            prefill.append((seq.request_id, remaining))
            if hit.blocks:
                cached.append((seq.request_id, hit))
            budget -= remaining
            seats -= 1
            free_kv_blocks -= needed_blocks
        if prefill:
            return StepPlan(admitted=tuple(admitted), prefill=tuple(prefill), cached=tuple(cached))

        # No prompt to start: every running request decodes.
        assert all(seq.prefill_done for seq in running)
        return StepPlan(decode=tuple(seq.request_id for seq in running))


def make_scheduler(config: SchedulerConfig) -> Scheduler:
    problems = config_problems(config)
    if problems:
        raise ValueError("; ".join(problems))
    if config.kind == "full":
        return FullScheduler(config)
    return ChunkedScheduler(config)
