"""A load generator for the gateway and the engines: closed-loop chat sessions plus long documents.

Every response is streamed, and the client measures what a user sees: the time to the first
token (TTFT), every gap between two tokens (TBT), and the whole request (end to end). Each
request becomes one `RequestRecord`, including those that fail or that the time limit cuts
off, so that a run can prove every request it issued is accounted for.

Time scale: a workload is described in model time (the time of the simulated hardware). With
`time_scale` k the generator waits k times less (think times, injection times, the duration)
and multiplies what it measures by k, so its records stay in model time and compare directly
with a virtual-time run, whatever the scale the engines run at.

What to send is planned, purely, in `workload` (the turns) and `prompts` (their text), and
summarised, purely, in `summary`; `LoadGenerator` here and `stream.stream_request` are the
I/O shell around them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.stream import StreamResult, client_session, stream_request
from laneway.bench.harness.workload import (
    EXPECTED_LANE,
    INTERACTIVE,
    LONG,
    LongRequest,
    Workload,
    draw_turn,
    session_rng,
    text_rng,
)
from laneway.tokens import Tokenizer, default_tokenizer


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it; times are model-time seconds."""

    kind: str  # INTERACTIVE or LONG: what the generator sent
    session: int  # the interactive session, -1 for a long request
    started_s: float  # since the run began
    prompt_tokens: int  # as the generator built it
    max_tokens: int
    status: int  # HTTP status; 0 when no response came (connection error, cut off)
    lane: str | None  # x-laneway-lane of the response (None straight from an engine)
    pool: str | None  # x-laneway-pool
    routed_prompt_tokens: int | None  # x-laneway-prompt-tokens
    output_tokens: int  # tokens received
    ttft_s: float | None
    gaps_s: tuple[float, ...]  # between consecutive tokens
    e2e_s: float | None  # until the stream ended, successfully or not
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def effective_lane(self) -> str:
        return self.lane or EXPECTED_LANE[self.kind]


async def run_until(limit_s: float, clients: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run `clients` together for at most `limit_s` wall seconds, then cut off whatever
    still runs (also when the run itself is cancelled); re-raise the first client error."""
    tasks = [asyncio.create_task(client) for client in clients]
    try:
        if tasks:
            await asyncio.wait(tasks, timeout=limit_s)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


class LoadGenerator:
    """Runs one workload against one base URL; `records` grows as requests finish."""

    def __init__(
        self,
        workload: Workload,
        base_url: str,
        time_scale: float = 1.0,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.workload = workload
        self.base_url = base_url.rstrip("/")
        self.time_scale = time_scale
        self.prompts = PromptFactory(tokenizer or default_tokenizer())
        self.records: list[RequestRecord] = []
        self.in_flight: Counter[str] = Counter()  # kind -> requests awaiting their end
        self.issued = 0
        self._interactive_issued = 0
        self._start: float | None = None

    def elapsed_s(self) -> float:
        """Model time since the run began (0 before it begins)."""
        if self._start is None:
            return 0.0
        return (time.perf_counter() - self._start) * self.time_scale

    async def run(self) -> list[RequestRecord]:
        workload = self.workload
        long_prompts = [
            self.prompts.text(random.Random(f"{workload.seed}/long/{index}"), long.prompt_tokens)
            for index, long in enumerate(workload.long_requests)
        ]
        async with client_session() as session:
            self._start = time.perf_counter()
            clients = [self._session(session, index) for index in range(workload.sessions)] + [
                self._long(session, long, prompt)
                for long, prompt in zip(workload.long_requests, long_prompts, strict=True)
            ]
            # What is cut off is recorded as such by _issue.
            await run_until((workload.duration_s + workload.drain_s) / self.time_scale, clients)
        return self.records

    async def _sleep_model(self, seconds: float) -> None:
        await asyncio.sleep(seconds / self.time_scale)

    async def _session(self, session: aiohttp.ClientSession, index: int) -> None:
        workload = self.workload
        rng = session_rng(workload.seed, index)
        await self._sleep_model(rng.uniform(0, workload.ramp_s))
        turns = 0
        while self.elapsed_s() < workload.duration_s:
            if (
                workload.max_requests is not None
                and self._interactive_issued >= workload.max_requests
            ):
                return
            turn = draw_turn(rng, workload)
            self._interactive_issued += 1
            turns += 1
            content = self.prompts.chat_content(
                text_rng(workload.seed, index, turns), turn.prompt_tokens
            )
            body = {
                "model": workload.model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": turn.output_tokens,
                "stream": True,
            }
            await self._issue(
                session,
                INTERACTIVE,
                index,
                workload.chat_path,
                body,
                self.prompts.chat_prompt_tokens(turn.prompt_tokens),
            )
            await self._sleep_model(turn.think_s)

    async def _long(self, session: aiohttp.ClientSession, long: LongRequest, prompt: str) -> None:
        await self._sleep_model(long.at_s)
        body = {
            "model": self.workload.model,
            "prompt": prompt,
            "max_tokens": long.output_tokens,
            "stream": True,
        }
        await self._issue(session, LONG, -1, self.workload.long_path, body, long.prompt_tokens)

    async def _issue(
        self,
        session: aiohttp.ClientSession,
        kind: str,
        session_index: int,
        path: str,
        body: Mapping[str, Any],
        prompt_tokens: int,
    ) -> None:
        started = self.elapsed_s()
        self.issued += 1
        self.in_flight[kind] += 1
        max_tokens = int(body["max_tokens"])
        try:
            result = await stream_request(
                session, self.base_url + path, body, self.workload.headers
            )
        except asyncio.CancelledError:
            self._record_failure(
                kind, session_index, started, prompt_tokens, max_tokens, "cut off at the time limit"
            )
            raise
        except (TimeoutError, aiohttp.ClientError, ValueError) as error:
            self._record_failure(
                kind,
                session_index,
                started,
                prompt_tokens,
                max_tokens,
                f"{type(error).__name__}: {error}",
            )
        else:
            self.records.append(
                self._record(kind, session_index, started, prompt_tokens, max_tokens, result)
            )
        finally:
            self.in_flight[kind] -= 1

    def _record(
        self,
        kind: str,
        session_index: int,
        started: float,
        prompt_tokens: int,
        max_tokens: int,
        result: StreamResult,
    ) -> RequestRecord:
        scale = self.time_scale
        routed = result.headers.get("x-laneway-prompt-tokens")
        return RequestRecord(
            kind=kind,
            session=session_index,
            started_s=started,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            status=result.status,
            lane=result.headers.get("x-laneway-lane"),
            pool=result.headers.get("x-laneway-pool"),
            routed_prompt_tokens=int(routed) if routed and routed.isdigit() else None,
            output_tokens=result.output_tokens,
            ttft_s=None if result.ttft_s is None else result.ttft_s * scale,
            gaps_s=tuple(gap * scale for gap in result.gaps_s),
            e2e_s=result.e2e_s * scale,
            error=result.error,
        )

    def _record_failure(
        self,
        kind: str,
        session_index: int,
        started: float,
        prompt_tokens: int,
        max_tokens: int,
        error: str,
    ) -> None:
        self.records.append(
            RequestRecord(
                kind=kind,
                session=session_index,
                started_s=started,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                status=0,
                lane=None,
                pool=None,
                routed_prompt_tokens=None,
                output_tokens=0,
                ttft_s=None,
                gaps_s=(),
                e2e_s=None,
                error=error,
            )
        )
