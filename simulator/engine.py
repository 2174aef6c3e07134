"""One simulated engine: request states, a KV cache in blocks, a scheduler and the cost model.

The core has no clock. `step()` plans, prices and applies one iteration and says how long
it took; the caller decides what that duration means: the virtual-time runner advances an
event clock by it, the HTTP server sleeps it (divided by the time scale).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from laneway.simulator.cost import PrefillChunk, StepWork, step_duration
from laneway.simulator.prefix_cache import NO_HIT, PrefixCache, PrefixHit
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import (
    KV_BLOCK_TOKENS,
    RequestState,
    SchedulerConfig,
    StepPlan,
    blocks_for,
    make_scheduler,
)

# The zero-service-time profile never runs out of KV: the gateway benchmark must not queue.
ZERO_PROFILE_KV_TOKENS = 1 << 40


class RequestRejected(ValueError):
    """The engine can never serve this request (too long for its context or its KV cache)."""


@dataclass(frozen=True)
class StepOutcome:
    duration_s: float
    work: StepWork
    admitted: tuple[str, ...]  # request ids that left the waiting queue in this step
    tokens: tuple[str, ...]  # request ids that produced one output token at the step's end
    first_tokens: tuple[str, ...]  # of those, the ones whose token is their first
    finished: tuple[str, ...]  # request ids that produced their last token in this step
    prefilled: tuple[str, ...] = ()  # the request id of each of `work.prefill`'s chunks
    # Of `admitted`, those that found prompt tokens in the prefix cache: how many.
    cached_tokens: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BlocksCached:
    """A request's prompt blocks `first`.. entered the prefix cache (vLLM's BlockStored)."""

    request_id: str
    first: int  # index of the first of them among the request's prompt blocks
    hashes: tuple[int, ...]
    parent: int | None  # the hash of the block before the first; None at the prompt's start


@dataclass(frozen=True)
class BlocksEvicted:
    """Free cached blocks dropped for room (vLLM's BlockRemoved)."""

    hashes: tuple[int, ...]


CacheEvent = BlocksCached | BlocksEvicted


class EngineCore:
    def __init__(
        self, profile: Profile, config: SchedulerConfig, record_cache_events: bool = False
    ) -> None:
        self.profile = profile
        self.config = config
        self.scheduler = make_scheduler(config)
        kv_tokens = (
            ZERO_PROFILE_KV_TOKENS if profile.zero_service_time else profile.kv_capacity_tokens
        )
        self.kv_capacity_blocks = kv_tokens // KV_BLOCK_TOKENS
        # Blocks held by running requests: their private blocks plus the cached blocks in
        # use (each counted once, however many requests share it). Free cached blocks are
        # not "used": they are evicted when a new request needs the room, as in vLLM.
        self.kv_used_blocks = 0
        self.prefix_cache = PrefixCache(KV_BLOCK_TOKENS)
        # The share of prompt tokens found cached among the prompts admitted by the latest
        # step that admitted any: what SGLang's `sglang:cache_hit_rate` gauge shows (it is
        # set per prefill batch, `log_prefill_stats`), where vLLM exports running counters.
        self.last_admission_hit_rate = 0.0
        self.waiting: list[RequestState] = []
        self.running: list[RequestState] = []
        # What entered and left the prefix cache since the caller last took them; None when
        # nobody publishes them (`--kv-events-config`).
        self.cache_events: list[CacheEvent] | None = [] if record_cache_events else None

    # -- requests in -----------------------------------------------------------------

    def check(self, prompt_tokens: int, max_output_tokens: int) -> None:
        """Raise RequestRejected if this engine could never serve such a request."""
        total = prompt_tokens + max_output_tokens
        if total > self.config.max_context:
            raise RequestRejected(
                f"This model's maximum context length is {self.config.max_context} tokens. "
                f"However, you requested {total} tokens ({prompt_tokens} in the messages, "
                f"{max_output_tokens} in the completion). Please reduce the length of the "
                "messages or completion."
            )
        if blocks_for(total) > self.kv_capacity_blocks:
            raise RequestRejected(
                f"the request needs {total} tokens of KV cache but this engine holds "
                f"{self.kv_capacity_blocks * KV_BLOCK_TOKENS}"
            )

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_output_tokens: int,
        block_hashes: tuple[int, ...] = (),
        priority: int = 0,
    ) -> None:
        """Queue a request; `block_hashes` (the prompt's, from `prefix_cache.block_hashes`)
        let it hit and fill the prefix cache when the engine has prefix caching on."""
        if prompt_tokens < 1 or max_output_tokens < 1:
            raise RequestRejected("a request needs at least one prompt and one output token")
        self.check(prompt_tokens, max_output_tokens)
        if priority and self.config.scheduling_policy != "priority":
            # vLLM's input processor refuses it the same way (400 over HTTP).
            raise RequestRejected(
                f"Got priority {priority} but Priority scheduling is not enabled."
            )
        hashes = (
            block_hashes[: prompt_tokens // KV_BLOCK_TOKENS] if self.config.prefix_caching else ()
        )
        self._enqueue(
            RequestState(
                request_id=request_id,
                prompt_tokens=prompt_tokens,
                max_output_tokens=max_output_tokens,
                block_hashes=hashes,
                priority=priority,
            )
        )

    def _enqueue(self, seq: RequestState) -> None:
        """Keep `waiting` in queue order: arrival, or (priority, arrival) under `priority`."""
        if self.config.scheduling_policy == "fcfs":
            self.waiting.append(seq)
            return
        # Behind every request of the same or a more urgent priority: FCFS within a level.
        at = bisect.bisect_right(self.waiting, seq.priority, key=lambda queued: queued.priority)
        self.waiting.insert(at, seq)

    def abort(self, request_id: str) -> None:
        """Forget a request (its client went away); frees its KV if it was running."""
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self._free(seq)
                return
        self.waiting = [seq for seq in self.waiting if seq.request_id != request_id]

    # -- state ---------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / self.kv_capacity_blocks if self.kv_capacity_blocks else 0.0

    # -- one iteration ---------------------------------------------------------------------

    def step(self) -> StepOutcome | None:
        """Plan, price and apply one step; None when the plan is empty (nothing can run)."""
        free_blocks = self.kv_capacity_blocks - self.kv_used_blocks
        plan = self.scheduler.schedule(self.waiting, self.running, free_blocks, self._lookup)
        if plan.is_empty:
            return None
        work = self._work_of(plan)
        duration = step_duration(self.profile, work)
        tokens, first_tokens, finished = self._apply(plan)
        return StepOutcome(
            duration_s=duration,
            work=work,
            admitted=plan.admitted,
            tokens=tokens,
            first_tokens=first_tokens,
            finished=finished,
            prefilled=tuple(rid for rid, _ in plan.prefill),
            cached_tokens={rid: hit.blocks * KV_BLOCK_TOKENS for rid, hit in plan.cached},
        )

    def _lookup(self, seq: RequestState) -> PrefixHit:
        if not seq.block_hashes:
            return NO_HIT
        return self.prefix_cache.lookup(seq.block_hashes, seq.prompt_tokens)

    def _work_of(self, plan: StepPlan) -> StepWork:
        states = {seq.request_id: seq for seq in self.running}
        states.update(
            {seq.request_id: seq for seq in self.waiting if seq.request_id in plan.admitted}
        )
        # An admitted prompt's cached tokens are context its first chunk attends to.
        starts = {rid: states[rid].computed_prompt_tokens for rid, _ in plan.prefill}
        starts.update({rid: hit.blocks * KV_BLOCK_TOKENS for rid, hit in plan.cached})
        chunks = tuple(
            PrefillChunk(
                tokens=tokens,
                context_before=starts[rid],
                completes_prompt=starts[rid] + tokens == states[rid].prompt_tokens,
            )
            for rid, tokens in plan.prefill
        )
        decode_context = sum(states[rid].context_tokens for rid in plan.decode)
        return StepWork(
            prefill=chunks, decode_count=len(plan.decode), decode_context_tokens=decode_context
        )

    def _apply(self, plan: StepPlan) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The only place request states change."""
        if plan.admitted:
            admitted = set(plan.admitted)
            joining = [seq for seq in self.waiting if seq.request_id in admitted]
            self.waiting = [seq for seq in self.waiting if seq.request_id not in admitted]
            self.running.extend(joining)
            hits = dict(plan.cached)
            for seq in joining:
                self._admit(seq, hits.get(seq.request_id, NO_HIT))
            if self.config.prefix_caching:
                hit_tokens = sum(hit.blocks for hit in hits.values()) * KV_BLOCK_TOKENS
                self.last_admission_hit_rate = hit_tokens / sum(s.prompt_tokens for s in joining)
        states = {seq.request_id: seq for seq in self.running}
        tokens: list[str] = []
        first_tokens: list[str] = []
        for rid, granted in plan.prefill:
            seq = states[rid]
            seq.computed_prompt_tokens += granted
            assert seq.computed_prompt_tokens <= seq.prompt_tokens
            self._cache_filled_blocks(seq)
            if seq.prefill_done:
                seq.generated_tokens += 1
                tokens.append(rid)
                first_tokens.append(rid)
        for rid in plan.decode:
            seq = states[rid]
            assert seq.prefill_done
            assert seq.generated_tokens > 0
            seq.generated_tokens += 1
            tokens.append(rid)
        finished = [
            rid for rid in tokens if states[rid].generated_tokens >= states[rid].max_output_tokens
        ]
        if finished:
            done = set(finished)
            for rid in finished:
                self._free(states[rid])
            self.running = [seq for seq in self.running if seq.request_id not in done]
        cache = self.prefix_cache
        assert self.kv_used_blocks >= 0
        assert self.kv_used_blocks + cache.free_cached_blocks <= self.kv_capacity_blocks
        assert len(self.running) <= self.config.max_num_seqs
        return tuple(tokens), tuple(first_tokens), tuple(finished)

    # -- KV blocks and the prefix cache ----------------------------------------------------

    def _admit(self, seq: RequestState, hit: PrefixHit) -> None:
        """Take the request's cached blocks and allocate the rest, evicting free cached
        blocks (least recently used first) when the never-used blocks run out."""
        cache = self.prefix_cache
        if self.config.prefix_caching:
            cache.acquire(seq.block_hashes, seq.prompt_tokens, hit)
        seq.held_blocks = list(seq.block_hashes[: hit.blocks])
        seq.computed_prompt_tokens = hit.blocks * KV_BLOCK_TOKENS
        seq.private_blocks = seq.kv_blocks - hit.blocks
        self.kv_used_blocks += seq.private_blocks + hit.evictable
        overflow = self.kv_used_blocks + cache.free_cached_blocks - self.kv_capacity_blocks
        if overflow > 0:
            evicted = cache.evict(overflow)
            if evicted and self.cache_events is not None:
                self.cache_events.append(BlocksEvicted(evicted))

    def _cache_filled_blocks(self, seq: RequestState) -> None:
        """Cache the prompt blocks this step filled (vLLM caches full blocks as they fill)."""
        filled = min(seq.computed_prompt_tokens // KV_BLOCK_TOKENS, len(seq.block_hashes))
        new: list[int] = []  # indexes of the blocks no request had cached: what is published
        for index in range(len(seq.held_blocks), filled):
            block_hash = seq.block_hashes[index]
            if self.cache_events is not None and not self.prefix_cache.cached(block_hash):
                new.append(index)
            # The block leaves the request's private blocks for the cache; if another
            # request cached the same block first, the two share that one.
            self.kv_used_blocks += self.prefix_cache.hold(block_hash) - 1
            seq.held_blocks.append(block_hash)
            seq.private_blocks -= 1
        if new:
            self._journal_cached(seq, new)

    def _journal_cached(self, seq: RequestState, new: list[int]) -> None:
        """One entry per run of consecutive new blocks, with the hash of the block before
        it, as vLLM's BlockStored events carry them."""
        assert self.cache_events is not None
        starts = [i for n, i in enumerate(new) if n == 0 or new[n - 1] != i - 1]
        ends = [i + 1 for n, i in enumerate(new) if n == len(new) - 1 or new[n + 1] != i + 1]
        for start, end in zip(starts, ends, strict=True):
            parent = seq.block_hashes[start - 1] if start else None
            run = tuple(seq.block_hashes[start:end])
            self.cache_events.append(
                BlocksCached(request_id=seq.request_id, first=start, hashes=run, parent=parent)
            )

    def _free(self, seq: RequestState) -> None:
        freed_to_cache = self.prefix_cache.release(seq.held_blocks)
        self.kv_used_blocks -= seq.private_blocks + freed_to_cache
        seq.held_blocks = []
