"""Which tokenizer counts a pool's prompts, and where the long counts run.

A pool's prompts are counted by a `PromptCounter`: `LocalCount` with a tokenizer the gateway
holds (each distinct `spec.tokenizer` loaded once, shared by every pool that names it: a
tokenizer.json takes milliseconds to load and megabytes to hold), or `EngineCount`, which asks
the pool's engine (`/tokenize`, vLLM's and SGLang's) for the exact count, only where the cheap
bounds do not decide the route.

Long prompts are counted in a worker process, not a thread. The encoders merge without the
interpreter lock but build their list of ids (128k of them) with it, and a thread that wants
the lock back takes it from the event loop for up to a switch interval at a time; a process
shares no lock with the loop, and runs niced so that where CPUs are short the kernel runs
the loop first. On the loaded 2-core machine the stall either way was close to the loop's
own scheduling noise (docs/BENCHMARKS.md). One worker: concurrent long counts queue behind
each other (a 128k count is ~0.1 s) rather than each holding a tokenizer's memory. The
worker gets what the count needs (the prompt's text, not the whole body) and loads each
tokenizer once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import multiprocessing
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import aiohttp
import orjson
from prometheus_client import Counter

from laneway.api import (
    DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS,
    InferencePool,
    TokenizerKind,
    TokenizerSpec,
)
from laneway.errors import UsageError
from laneway.gateway.errors import ApiError, bad_request
from laneway.gateway.serving.request_body import ParsedRequest
from laneway.ledger import Ledger
from laneway.tokens import (
    ChatTemplateError,
    TokenBounds,
    Tokenizer,
    TokenizerRecipe,
    load_tokenizer,
    utf8_length,
)

log = logging.getLogger("laneway.gateway.counting")

# What an engine's chat template may add around the texts of a chat, in tokens, for pools
# whose template the gateway does not hold. Llama 3.1's default system block (knowledge
# cutoff and date) is about 25 tokens and its per-message header 5; Qwen 2.5's default system
# prompt about 20; generous room for templates like them. Tool definitions are rendered in
# whatever form a template likes, so a chat with tools is not bounded at all.
ENGINE_FRAMING_PER_CHAT = 256
ENGINE_FRAMING_PER_MESSAGE = 16
# A completion prompt gets the tokenizer's post-processor specials (BOS, maybe EOS).
ENGINE_SPECIALS_PER_PROMPT = 2
UNBOUNDED = 1 << 62
# Prompt text this short is counted on the event loop in well under a millisecond.
INLINE_COUNT_CHARS = 16 * 1024
# Distinct prompts whose engine counts are kept: a client retrying, or a pool's bounds
# undecided for the same prompt again, does not ask twice.
ENGINE_COUNT_CACHE_ENTRIES = 4096


class PromptCounter(Protocol):
    """One pool's way of counting a prompt."""

    @property
    def method(self) -> str:
        """How `count` counts (the tokenization metric's label)."""

    def inline(self, parsed: ParsedRequest) -> TokenBounds:
        """Where the body is small: the exact count if it costs nothing to take, else bounds."""

    def length_bounds(self, parsed: ParsedRequest) -> TokenBounds | None:
        """Looser bounds from the texts' lengths alone, tried first; None where there are
        none cheaper than `bounds`."""

    def bounds(self, parsed: ParsedRequest) -> TokenBounds:
        """Cheap bounds on the count (run in a thread for big bodies)."""

    async def count(self, parsed: ParsedRequest) -> int:
        """The exact count, without holding the event loop."""

    @property
    def once_routed(self) -> PromptCounter:
        """What counts a prompt the bounds have already routed (for its header and metrics)."""


class PoolTokenizers:
    def __init__(
        self,
        default: Tokenizer,
        retry_after_s: int,
        worker: OffLoopCounter,
        engine: EngineTokenize,
    ) -> None:
        self.default = LocalCount(default, worker)
        self._retry_after_s = retry_after_s
        self._worker = worker
        self._engine = engine
        self._loaded: dict[TokenizerSpec, LocalCount] = {}
        # Per served model, its pools' counters, for the pools they were built from.
        self._serving_pools: tuple[InferencePool, ...] = ()
        self._serving: dict[str, ModelCounters] = {}

    def serving(self, pools: tuple[InferencePool, ...], model: str) -> ModelCounters:
        """The counters of the pools among `pools` that serve `model`: built once per model
        while `pools` (the ledger's tuple) is unchanged. Unknown models are not kept."""
        if pools is not self._serving_pools:
            self._serving_pools, self._serving = pools, {}
        known = self._serving.get(model)
        if known is not None:
            return known
        by_pool = {pool.key: self.of(pool) for pool in pools if model in pool.spec.public_models}
        distinct = tuple({id(t): t for t in by_pool.values()}.values()) or (self.default,)
        counters = ModelCounters(by_pool, distinct)
        if by_pool:
            self._serving[model] = counters
        return counters

    def of(self, pool: InferencePool) -> PromptCounter:
        spec = pool.spec.tokenizer
        if spec is None:
            return self.default
        if spec.kind is TokenizerKind.ENGINE:
            return EngineCount(pool, self._engine, self.default)
        loaded = self._loaded.get(spec)
        if loaded is None:
            try:
                tokenizer = load_tokenizer(
                    spec.kind.value, spec.encoding, spec.path, spec.config_path
                )
            except UsageError as error:
                # Not cached: a ConfigMap mounted late is picked up by the next request.
                raise ApiError(
                    503,
                    f"Pool {pool.name} names a tokenizer the gateway cannot load: {error}",
                    "tokenizer_unavailable",
                    retry_after=self._retry_after_s,
                ) from None
            loaded = self._loaded[spec] = LocalCount(tokenizer, self._worker)
        return loaded


@dataclass(frozen=True)
class ModelCounters:
    by_pool: Mapping[str, PromptCounter]  # pool key -> how that pool counts
    distinct: tuple[PromptCounter, ...]  # each counter once: a prompt is counted once by each


@dataclass(frozen=True)
class LocalCount:
    """Counts with a tokenizer the gateway holds (and its chat template, if it has one)."""

    tokenizer: Tokenizer
    worker: OffLoopCounter
    method: str = "offloop"

    def inline(self, parsed: ParsedRequest) -> TokenBounds:
        count = _refused_chat_is_bad_request(parsed.count, self.tokenizer)
        return TokenBounds(count, count)

    def length_bounds(self, parsed: ParsedRequest) -> TokenBounds | None:
        return parsed.length_bounds(self.tokenizer)

    def bounds(self, parsed: ParsedRequest) -> TokenBounds:
        return _refused_chat_is_bad_request(parsed.bounds, self.tokenizer)

    async def count(self, parsed: ParsedRequest) -> int:
        if parsed.text_chars <= INLINE_COUNT_CHARS:
            return _refused_chat_is_bad_request(parsed.count, self.tokenizer)
        try:
            return await self.worker.count(parsed, self.tokenizer)
        except ChatTemplateError as error:
            raise bad_request(str(error), "messages") from None

    @property
    def once_routed(self) -> PromptCounter:
        return self


T = TypeVar("T")


def _refused_chat_is_bad_request(measure: Callable[[Tokenizer], T], tokenizer: Tokenizer) -> T:
    # The engine's template would refuse the chat too (vLLM answers 400 with its message).
    try:
        return measure(tokenizer)
    except ChatTemplateError as error:
        raise bad_request(str(error), "messages") from None


@dataclass(frozen=True)
class EngineCount:
    """Counts by asking the pool's engine; bounds without any tokenizer (bytes)."""

    pool: InferencePool
    engine: EngineTokenize
    fallback: LocalCount
    method: str = "engine"

    def inline(self, parsed: ParsedRequest) -> TokenBounds:
        return self.bounds(parsed)

    def length_bounds(self, parsed: ParsedRequest) -> TokenBounds | None:
        return None  # `bounds` takes the lengths alone already

    def bounds(self, parsed: ParsedRequest) -> TokenBounds:
        return tokenizer_free_bounds(parsed)

    async def count(self, parsed: ParsedRequest) -> int:
        return await self.engine.count(self.pool, parsed, self.fallback)

    @property
    def once_routed(self) -> PromptCounter:
        # The engine is asked only where its count decides the route; a routed prompt's
        # header and metrics take the gateway's own count.
        return self.fallback


def tokenizer_free_bounds(parsed: ParsedRequest) -> TokenBounds:
    """Bounds that hold for any tokenizer whose every token covers at least one UTF-8 byte
    (byte-level BPE, SentencePiece with byte fallback): none below, the bytes above."""
    if parsed.is_chat:
        if parsed.extra_texts:
            return TokenBounds(0, UNBOUNDED)
        texts = sum(utf8_length(m.role) + utf8_length(m.content) for m in parsed.messages)
        framing = ENGINE_FRAMING_PER_CHAT + ENGINE_FRAMING_PER_MESSAGE * len(parsed.messages)
        return TokenBounds(0, texts + framing)
    longest = max(
        [utf8_length(p) + ENGINE_SPECIALS_PER_PROMPT for p in parsed.prompts]
        + list(parsed.token_prompt_lengths)
    )
    return TokenBounds(0, longest + sum(utf8_length(t) for t in parsed.extra_texts))


class EngineUnanswered(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class EngineTokenize:
    """Asks engines for their counts: vLLM's and SGLang's `/tokenize`.

    Both take `{"model", "messages", "tools"}` for a chat (rendered through the model's chat
    template with the generation prompt, as a chat completion is: vLLM's TokenizeChatRequest,
    SGLang's serving_tokenize.py since it took `messages`) and `{"model", "prompt"}` for a
    text (special tokens added, as a completion does), and answer `count`, `tokens` and
    `max_model_len`. An engine that does not answer in time, or answers otherwise, leaves the
    count to the gateway's default tokenizer: logged, and counted in
    `laneway_gateway_engine_counts{outcome}`.
    """

    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession],
        ledger: Ledger,
        outcomes: Counter,
    ) -> None:
        self._session = session
        self._ledger = ledger
        self._outcomes = outcomes
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._turn = 0

    async def count(self, pool: InferencePool, parsed: ParsedRequest, fallback: LocalCount) -> int:
        try:
            if parsed.is_chat:
                return await self._ask(pool, _chat_question(parsed))
            # A list of prompts runs as separate sequences: the longest one decides, as in
            # ParsedRequest.count; each text is asked for alone (vLLM takes one string).
            asked = [self._ask(pool, {"prompt": p}) for p in parsed.prompts] + [
                # A suffix gets no BOS of its own.
                self._ask(pool, {"prompt": text, "add_special_tokens": False})
                for text in parsed.extra_texts
            ]
            counts = await asyncio.gather(*asked)
            prompts = counts[: len(parsed.prompts)] + list(parsed.token_prompt_lengths)
            return sum(counts[len(parsed.prompts) :]) + max(prompts)
        except EngineUnanswered as unanswered:
            self._outcomes.labels(pool.key, unanswered.reason).inc()
            log.warning(
                "pool %s: the engine did not count the prompt (%s: %s); counting with the "
                "gateway's default tokenizer instead",
                pool.key,
                unanswered.reason,
                unanswered,
            )
            return await fallback.count(parsed)

    async def _ask(self, pool: InferencePool, question: dict[str, Any]) -> int:
        body = orjson.dumps({"model": pool.spec.served_model_name, **question})
        digest = hashlib.blake2b(pool.key.encode(), digest_size=16)
        digest.update(b"\0")
        digest.update(body)
        key = digest.digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self._outcomes.labels(pool.key, "cached").inc()
            return cached
        count = await self._post(pool, body)
        self._outcomes.labels(pool.key, "engine").inc()
        self._cache[key] = count
        if len(self._cache) > ENGINE_COUNT_CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return count

    async def _post(self, pool: InferencePool, body: bytes) -> int:
        endpoints = self._ledger.available(pool)
        if not endpoints:
            raise EngineUnanswered("no_endpoint", "the pool has no available endpoint")
        # In turn, so that no one engine answers every pool's questions.
        self._turn += 1
        url = f"{endpoints[self._turn % len(endpoints)]}/tokenize"
        spec = pool.spec.tokenizer
        millis = spec.timeout_millis if spec else DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS
        timeout_s = millis / 1000
        try:
            async with (
                asyncio.timeout(timeout_s),
                self._session().post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as response,
            ):
                answer = await response.read()
        except TimeoutError:
            raise EngineUnanswered("timeout", f"{url} took over {timeout_s:g} s") from None
        except aiohttp.ClientError as error:
            raise EngineUnanswered("unreachable", f"{url}: {error}") from None
        if response.status != 200:
            reason = "refused" if response.status < 500 else "failed"
            raise EngineUnanswered(reason, f"{url} answered {response.status}: {answer[:200]!r}")
        try:
            count = orjson.loads(answer).get("count")
        except (ValueError, AttributeError):
            count = None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            detail = f"{url} answered without a count: {answer[:200]!r}"
            raise EngineUnanswered("bad_answer", detail)
        return count


def _chat_question(parsed: ParsedRequest) -> dict[str, Any]:
    """The chat as the engine's template gets it on a chat completion."""
    chat = parsed.chat_body
    question: dict[str, Any] = {"messages": chat["messages"]}
    tools = chat.get("tools")
    if tools is not None:
        question["tools"] = tools
    return question


# Below the event loop's priority: where CPUs are short, the scheduler runs the loop first.
WORKER_NICENESS = 10


class OffLoopCounter:
    """Exact counts in one worker process, started on the first long prompt."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def count(self, parsed: ParsedRequest, tokenizer: Tokenizer) -> int:
        if self._pool is None:
            # spawn, not fork: the gateway has threads (the executor's) whose locks a fork
            # would copy mid-use; and no forkserver left behind.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=os.nice, initargs=(WORKER_NICENESS,)
            )
        # The body's other fields stay here; a chat template renders the messages and tools.
        payload = (
            {k: v for k, v in parsed.chat_body.items() if k in ("messages", "tools")}
            if tokenizer.chat_template is not None
            else {}
        )
        prompt = dataclasses.replace(parsed, payload=payload, chat_input=None)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, _count, tokenizer.recipe, prompt)
        except BrokenProcessPool:
            # The worker died (killed for memory, or it could not start): count this one in
            # a thread, at the loop's cost, and start a fresh worker for the next.
            self.close()
            return await loop.run_in_executor(None, parsed.count, tokenizer)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


@functools.cache
def _tokenizer(recipe: TokenizerRecipe) -> Tokenizer:
    return load_tokenizer(recipe.kind, recipe.encoding, recipe.path, recipe.chat_template)


def _count(recipe: TokenizerRecipe, prompt: ParsedRequest) -> int:
    """Runs in the worker process."""
    return prompt.count(_tokenizer(recipe))
