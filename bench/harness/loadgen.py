"""A load generator for the gateway and the engines: closed-loop chat sessions plus long documents.

Every response is streamed, and the client measures what a user sees: the time to the first
token (TTFT), every gap between two tokens (TBT), and the whole request (end to end). Each
request becomes one `RequestRecord`, including those that fail or that the time limit cuts
off, so that a run can prove every request it issued is accounted for.

Time scale: a workload is described in model time (the time of the simulated hardware). With
`time_scale` k the generator waits k times less (think times, injection times, the duration)
and multiplies what it measures by k, so its records stay in model time and compare directly
with a virtual-time run, whatever the scale the engines run at.

The planning (`draw_turn`, `PromptFactory`) and the statistics (`summarize`)
are pure; `LoadGenerator` and `stream_request` are the I/O shell around them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from laneway.stats import percentile
from laneway.tokens import ChatMessage, Tokenizer, count_chat, default_tokenizer

if TYPE_CHECKING:
    from laneway.simulator.seed import SeedScenario

INTERACTIVE = "interactive"
LONG = "long"
# What a request of each kind expects to be routed to, when no gateway says otherwise.
EXPECTED_LANE = {INTERACTIVE: "interactive", LONG: "batch"}


@dataclass(frozen=True)
class LongRequest:
    at_s: float  # model time after the start at which it is sent
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Workload:
    """What to send, in model time; reproducible from `seed`."""

    model: str
    sessions: int = 8  # concurrent closed-loop interactive sessions
    prompt_tokens: tuple[int, int] = (200, 1500)  # inclusive range per interactive turn
    output_tokens: tuple[int, int] = (50, 250)
    think_s: tuple[float, float] = (1.0, 3.0)  # pause between a reply and the next turn
    ramp_s: float = 1.0  # each session starts at a uniformly drawn moment within this
    duration_s: float = 30.0  # no interactive turn starts after this
    max_requests: int | None = None  # a cap on interactive turns, across sessions
    long_requests: tuple[LongRequest, ...] = ()
    # After the duration, in-flight requests (long ones included) get this much longer to
    # finish; then they are cut off and recorded as such.
    drain_s: float = 120.0
    seed: int = 0
    chat_path: str = "/v1/chat/completions"  # interactive turns are chat requests
    long_path: str = "/v1/completions"  # long documents are plain completions
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = _workload_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def long_request_count(self) -> int:
        return len(self.long_requests)


def workload_from_scenario(scenario: SeedScenario, model: str, drain_s: float = 300.0) -> Workload:
    """The seed experiment's workload (laneway.simulator.seed), to replay it live."""
    burst = LongRequest(
        at_s=scenario.burst_at_s,
        prompt_tokens=scenario.long_tokens,
        output_tokens=scenario.long_output_tokens,
    )
    return Workload(
        model=model,
        sessions=scenario.sessions,
        prompt_tokens=scenario.prompt_tokens,
        output_tokens=scenario.output_tokens,
        think_s=scenario.think_time_s,
        ramp_s=scenario.session_start_spread_s,
        duration_s=scenario.duration_s,
        long_requests=(burst,) * scenario.long_requests,
        drain_s=drain_s,
        seed=scenario.seed,
    )


def _workload_problems(workload: Workload) -> list[str]:
    problems = []
    for name in ("prompt_tokens", "output_tokens", "think_s"):
        low, high = getattr(workload, name)
        if low < 0 or high < low:
            problems.append(f"{name} must be a range low <= high with low >= 0, got {low}-{high}")
    if workload.prompt_tokens[0] < 1 or workload.output_tokens[0] < 1:
        problems.append("prompt and output lengths must be at least 1 token")
    if workload.sessions < 0:
        problems.append(f"sessions must be >= 0, got {workload.sessions}")
    if workload.duration_s < 0 or workload.ramp_s < 0 or workload.drain_s < 0:
        problems.append("duration_s, ramp_s and drain_s must be >= 0")
    if workload.max_requests is not None and workload.max_requests < 0:
        problems.append(f"max_requests must be >= 0, got {workload.max_requests}")
    problems.extend(
        f"long request {index}: needs at_s >= 0 and positive token counts"
        for index, long in enumerate(workload.long_requests)
        if long.at_s < 0 or long.prompt_tokens < 1 or long.output_tokens < 1
    )
    return problems


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    output_tokens: int
    think_s: float  # model time to wait after this turn's reply


def draw_turn(rng: random.Random, workload: Workload) -> Turn:
    return Turn(
        prompt_tokens=rng.randint(*workload.prompt_tokens),
        output_tokens=rng.randint(*workload.output_tokens),
        think_s=rng.uniform(*workload.think_s),
    )


def session_rng(seed: int, session: int) -> random.Random:
    """Each session's own stream, so that one session's draws never shift another's.

    Seeded and drawn from exactly as the virtual seed experiment
    (laneway.simulator.seed_experiment) does: the start offset, then per turn the prompt
    length, the output length and the think time. A live run therefore sends the very
    turns a virtual run of the same seed prices.
    """
    return random.Random(f"{seed}/session/{session}")


def text_rng(seed: int, session: int, turn: int) -> random.Random:
    """Prompt wording, drawn apart from the session stream so that it never shifts it."""
    return random.Random(f"{seed}/text/{session}/{turn}")


# Common English words; those that are one token with a leading space make prompts of an
# exact length without counting them word by word.
_COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "if so no will can more other what time up out about into than them only some could "
    "new these two may first then do any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three order price review contract clause report summary customer search answer question"
)


class PromptFactory:
    """Text that is exactly N tokens long for the tokenizer the gateway and engines use."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._words = tuple(
            w
            for w in _COMMON_WORDS.split()
            if len(tokenizer.encode(w)) == 1 and len(tokenizer.encode(f" {w}")) == 1
        )
        if len(self._words) < 16:
            raise ValueError(f"tokenizer {tokenizer.name} splits too many common words")
        self._chat_overhead = count_chat(tokenizer, [ChatMessage(role="user", content="")])

    def text(self, rng: random.Random, tokens: int) -> str:
        text = " ".join(rng.choices(self._words, k=tokens))
        # Words that are one token each with their space never merge across a space, but
        # the check keeps that promise honest for any tokenizer.
        count = self._tokenizer.count(text)
        if count != tokens:
            raise ValueError(f"{self._tokenizer.name}: wanted {tokens} tokens, made {count}")
        return text

    def chat_content(self, rng: random.Random, prompt_tokens: int) -> str:
        """A user message whose whole chat prompt counts `prompt_tokens` (at least the framing)."""
        return self.text(rng, max(prompt_tokens - self._chat_overhead, 1))

    def chat_prompt_tokens(self, prompt_tokens: int) -> int:
        """What `chat_content(rng, prompt_tokens)` really counts as a chat prompt."""
        return max(prompt_tokens - self._chat_overhead, 1) + self._chat_overhead


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


@dataclass(frozen=True)
class StreamResult:
    """One streamed request in wall-clock seconds, before any time scaling."""

    status: int
    headers: Mapping[str, str]
    ttft_s: float | None
    gaps_s: tuple[float, ...]
    e2e_s: float
    output_tokens: int
    error: str | None
    error_code: str | None = None  # the OpenAI error's `code`, when the error had one
    text: str = ""  # the streamed content, when asked to keep it
    sent_at: float = 0.0  # when it was sent, on the clock it was timed by


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    keep_text: bool = False,
) -> StreamResult:
    """POST a `stream: true` OpenAI request and time each token as it arrives; with
    `keep_text`, also keep what it says (a chat client sends it back in the next turn)."""
    start = clock()
    arrivals: list[float] = []
    parts: list[str] = []
    error: str | None = None
    code: str | None = None
    async with session.post(url, json=body, headers=headers) as response:
        reply_headers = {k.lower(): v for k, v in response.headers.items()}
        if response.status != 200:
            reply = await response.read()
            error, code = _error_message(reply), _error_code(reply)
            return StreamResult(
                status=response.status,
                headers=reply_headers,
                ttft_s=None,
                gaps_s=(),
                e2e_s=clock() - start,
                output_tokens=0,
                error=error,
                error_code=code,
                sent_at=start,
            )
        done = False
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            event = json.loads(payload)
            if "error" in event:
                error, code = _error_message(payload), _error_code(payload)
                break
            content = _token_text(event)
            if content:
                arrivals.append(clock())
                if keep_text:
                    parts.append(content)
        end = clock()
    if not done and error is None:
        error = "stream ended without [DONE]"
    gaps = tuple(b - a for a, b in itertools.pairwise(arrivals))
    ttft = arrivals[0] - start if arrivals else None
    text = "".join(parts)
    return StreamResult(
        status=200,
        headers=reply_headers,
        ttft_s=ttft,
        gaps_s=gaps,
        e2e_s=end - start,
        output_tokens=len(arrivals),
        error=error,
        error_code=code,
        text=text,
        sent_at=start,
    )


def _token_text(event: Mapping[str, Any]) -> str:
    """The content a streamed chunk carries ("" for a role-only or empty chunk)."""
    text = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, Mapping) else choice.get("text")
        if content:
            text += str(content)
    return text


def _error_code(body: bytes) -> str | None:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return None if code is None else str(code)


def _error_message(body: bytes) -> str:
    try:
        document = json.loads(body)
        message = document["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")[:200] or "(empty body)"
    return str(message)


def client_session() -> aiohttp.ClientSession:
    """A load generator's HTTP client: as many connections as it has requests, no deadline."""
    connector = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


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


# -- statistics (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    count: int
    p50: float
    p99: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Distribution | None:
        if not values:
            return None
        return Distribution(
            count=len(values),
            p50=percentile(values, 50),
            p99=percentile(values, 99),
            max=max(values),
        )


@dataclass(frozen=True)
class LaneSummary:
    lane: str
    requests: int
    ok: int
    failed: int
    output_tokens: int
    ttft: Distribution | None
    tbt: Distribution | None  # over every gap of every request in the lane
    e2e: Distribution | None  # successful requests only
    pools: tuple[tuple[str, int], ...]  # (pool, requests), most used first
    errors: tuple[tuple[str, int], ...]  # (message, count), most common first


def summarize(records: Iterable[RequestRecord]) -> tuple[LaneSummary, ...]:
    """One summary per lane the requests went to, interactive first."""
    by_lane: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_lane.setdefault(record.effective_lane, []).append(record)
    order = {"interactive": 0, "batch": 1}
    return tuple(
        _summarize_lane(lane, by_lane[lane])
        for lane in sorted(by_lane, key=lambda lane: (order.get(lane, 2), lane))
    )


def _summarize_lane(lane: str, records: Sequence[RequestRecord]) -> LaneSummary:
    ok = [r for r in records if r.ok]
    pools = Counter(r.pool or "(engine)" for r in records if r.status != 0)
    errors = Counter(
        f"{r.status}: {r.error}" if r.status else str(r.error) for r in records if not r.ok
    )
    return LaneSummary(
        lane=lane,
        requests=len(records),
        ok=len(ok),
        failed=len(records) - len(ok),
        output_tokens=sum(r.output_tokens for r in records),
        ttft=Distribution.of([r.ttft_s for r in records if r.ttft_s is not None]),
        tbt=Distribution.of([gap for r in records for gap in r.gaps_s]),
        e2e=Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        pools=tuple(pools.most_common()),
        errors=tuple(errors.most_common()),
    )
