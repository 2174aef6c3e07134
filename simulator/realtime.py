"""The simulated engine in real time: an EngineCore stepped against the wall clock.

A background task takes one step, sleeps the step's duration divided by the time scale,
and then hands the step's tokens to the requests' streams; the HTTP server (server.py)
submits requests and relays what comes out of their streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from laneway.api import MetricsFlavor
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.kv_events import ZmqEventPublisher, wire_events
from laneway.simulator.metrics import EngineGauges, SimulatorMetrics

MAX_LAG_S = 0.01  # wall seconds the step clock may fall behind before it resets


@dataclass(frozen=True)
class TokenEvent:
    index: int  # 0 for the first output token
    last: bool
    cached_tokens: int  # of the prompt, found in the prefix cache (its usage reports them)


@dataclass
class _Tracked:
    prompt_tokens: int
    arrived: float  # simulated seconds
    stream: asyncio.Queue[TokenEvent]
    prompt_token_ids: Sequence[int]  # what KV events describe stored blocks with
    emitted: int = 0
    last_token: float = 0.0
    cached_tokens: int = 0


class RealTimeEngine:
    """Drives an EngineCore against the wall clock, scaled by `time_scale`."""

    def __init__(self, core: EngineCore, time_scale: float, metrics_flavor: MetricsFlavor,
                 model: str, publisher: ZmqEventPublisher | None = None) -> None:  # fmt: skip
        self.core = core
        self.publisher = publisher
        self.time_scale = time_scale
        self.busy_s = 0.0  # simulated seconds spent in steps
        self.metrics = SimulatorMetrics(metrics_flavor, model, self._gauges)
        self._tracked: dict[str, _Tracked] = {}
        self._wake = asyncio.Event()
        self._origin = asyncio.get_running_loop().time()

    def sim_now(self) -> float:
        return (asyncio.get_running_loop().time() - self._origin) * self.time_scale

    def _gauges(self) -> EngineGauges:
        core = self.core
        return EngineGauges(
            running=len(core.running),
            waiting=len(core.waiting),
            kv_usage=core.kv_usage,
            busy_s=self.busy_s,
            prefix_query_tokens=core.prefix_cache.query_tokens,
            prefix_hit_tokens=core.prefix_cache.hit_tokens,
            last_batch_hit_rate=core.last_admission_hit_rate,
        )

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        priority: int = 0,
        prompt_block_hashes: tuple[int, ...] = (),
        prompt_token_ids: Sequence[int] = (),
    ) -> asyncio.Queue[TokenEvent]:
        """Queue a request; its tokens arrive on the returned queue. Raises RequestRejected."""
        self.core.submit(
            request_id, prompt_tokens, max_tokens, prompt_block_hashes, priority=priority
        )
        stream: asyncio.Queue[TokenEvent] = asyncio.Queue()
        ids = prompt_token_ids if self.publisher is not None else ()
        self._tracked[request_id] = _Tracked(
            prompt_tokens=prompt_tokens, arrived=self.sim_now(), stream=stream, prompt_token_ids=ids
        )
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        if self._tracked.pop(request_id, None) is not None:
            self.core.abort(request_id)
            self.metrics.finished("abort", 0.0)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        # When the simulated GPU finishes its current step. Steps run back to back on this
        # clock, so the server's own work between steps (delivering tokens, planning) is not
        # added to simulated time; it overlaps the next step, as vLLM's async scheduling does.
        gpu_free_at = loop.time()
        while True:
            if not self.core.has_work:
                self._wake.clear()
                await self._wake.wait()
                gpu_free_at = loop.time()
                continue
            outcome = self.core.step()
            if outcome is None:
                self._wake.clear()
                await self._wake.wait()
                gpu_free_at = loop.time()
                continue
            self.busy_s += outcome.duration_s
            gpu_free_at += outcome.duration_s / self.time_scale
            behind = loop.time() - gpu_free_at
            if behind > MAX_LAG_S:
                # Starved of CPU: resume from now rather than emit a burst of late steps.
                gpu_free_at += behind
            await asyncio.sleep(max(0.0, gpu_free_at - loop.time()))
            self._publish_cache_events()
            self._deliver(outcome)

    def _publish_cache_events(self) -> None:
        """The step's prefix-cache changes as one KV event batch, before its tokens go out."""
        events = self.core.cache_events
        if self.publisher is None or not events:
            return
        tracked = self._tracked

        def token_ids(request_id: str) -> Sequence[int] | None:
            found = tracked.get(request_id)
            return found.prompt_token_ids if found is not None else None

        wired = wire_events(events, token_ids)
        events.clear()
        if wired:
            self.publisher.publish(wired)

    def _deliver(self, outcome: StepOutcome) -> None:
        now = self.sim_now()
        for rid in outcome.admitted:
            if (tracked := self._tracked.get(rid)) is not None:
                self.metrics.admitted(now - tracked.arrived)
                tracked.cached_tokens = outcome.cached_tokens.get(rid, 0)
        finished = set(outcome.finished)
        # vLLM's vllm:iteration_tokens_total as vLLM counts it (v1/metrics/stats.py,
        # IterationStats): per step that emits tokens, those tokens plus the whole prompt of
        # each request whose first token this is; a step that only advances a prefill emits
        # nothing and is not counted.
        step_tokens = 0
        for rid in outcome.tokens:
            tracked = self._tracked.get(rid)
            if tracked is None:
                continue
            step_tokens += 1 + (tracked.prompt_tokens if tracked.emitted == 0 else 0)
            if tracked.emitted == 0:
                self.metrics.first_token(tracked.prompt_tokens, now - tracked.arrived)
            else:
                self.metrics.next_token(now - tracked.last_token)
            last = rid in finished
            event = TokenEvent(
                index=tracked.emitted, last=last, cached_tokens=tracked.cached_tokens
            )
            tracked.stream.put_nowait(event)
            tracked.emitted += 1
            tracked.last_token = now
            if last:
                self.metrics.finished("length", now - tracked.arrived)
                del self._tracked[rid]
        if step_tokens:
            self.metrics.stepped(step_tokens)
