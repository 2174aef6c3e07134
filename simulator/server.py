"""`laneway sim`: one simulated engine behind an OpenAI-compatible aiohttp server.

The engine core (scheduler, KV cache, cost model) runs in real time: a background task
takes one step, sleeps the step's duration divided by the time scale, and then hands the
step's tokens to the requests' streams. Handlers only parse, count prompt tokens, submit,
and relay what the engine emits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from laneway.api import MetricsFlavor
from laneway.errors import cannot_listen
from laneway.prompt_ids import chat_token_ids
from laneway.simulator.engine import EngineCore, RequestRejected, StepOutcome
from laneway.simulator.kv_events import KVEventsConfig, ZmqEventPublisher, wire_events
from laneway.simulator.metrics import EngineGauges, SimulatorMetrics
from laneway.simulator.prefix_cache import block_hashes
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import KV_BLOCK_TOKENS, SchedulerConfig
from laneway.tokens import (
    ChatMessage,
    ChatTemplateError,
    Tokenizer,
    count_chat,
    default_tokenizer,
    template_chat,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 256  # vLLM fills the context; a simulator should end sooner
MAX_BODY_BYTES = 64 * 1024 * 1024  # a 128k-token prompt is about 0.6 MB; leave room
T = TypeVar("T")

OFF_LOOP_CHARS = 16_384  # prompts longer than this are tokenized (and hashed) in a thread
MAX_LAG_S = 0.01  # wall seconds the step clock may fall behind before it resets
OUTPUT_WORDS = (" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing")

ApiRoute = Literal["completions", "chat"]


@dataclass(frozen=True)
class SimSettings:
    model: str
    profile: Profile
    scheduler: SchedulerConfig
    metrics_flavor: MetricsFlavor = MetricsFlavor.VLLM
    time_scale: float = 1.0
    kv_events: KVEventsConfig | None = None  # --kv-events-config; None: not published


@dataclass(frozen=True)
class TokenEvent:
    index: int  # 0 for the first output token
    last: bool


class OpenAIError(Exception):
    """Turned into vLLM's error JSON by the middleware."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


# The error "type" vLLM's server sends (the exception's name), not OpenAI's types.
VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
               413: "RequestEntityTooLarge", 500: "InternalServerError"}  # fmt: skip


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": VLLM_ERROR_TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
    }
    return web.json_response(body, status=status)


@dataclass
class _Tracked:
    prompt_tokens: int
    arrived: float  # simulated seconds
    stream: asyncio.Queue[TokenEvent]
    prompt_token_ids: Sequence[int]  # what KV events describe stored blocks with
    emitted: int = 0
    last_token: float = 0.0


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
            len(core.running),
            len(core.waiting),
            core.kv_usage,
            self.busy_s,
            core.prefix_cache.query_tokens,
            core.prefix_cache.hit_tokens,
            core.last_admission_hit_rate,
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
        self._tracked[request_id] = _Tracked(prompt_tokens, self.sim_now(), stream, ids)
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
        finished = set(outcome.finished)
        for rid in outcome.tokens:
            tracked = self._tracked.get(rid)
            if tracked is None:
                continue
            if tracked.emitted == 0:
                self.metrics.first_token(tracked.prompt_tokens, now - tracked.arrived)
            else:
                self.metrics.next_token(now - tracked.last_token)
            last = rid in finished
            tracked.stream.put_nowait(TokenEvent(tracked.emitted, last))
            tracked.emitted += 1
            tracked.last_token = now
            if last:
                self.metrics.finished("length", now - tracked.arrived)
                del self._tracked[rid]


# -- request parsing ---------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: ApiRoute
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int = 0  # vLLM's extra request field; lower is more urgent
    # The prompt's token ids in prefix-cache blocks (prefix_cache.block_hashes): what lets
    # a repeated prefix skip its prefill, as automatic prefix caching does.
    block_hashes: tuple[int, ...] = ()
    token_ids: Sequence[int] = ()  # the prompt's, for KV events


def _priority(body: dict[str, Any]) -> int:
    value = body.get("priority", 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError(400, f"'priority' must be an integer, got {value!r}", "priority")
    return value


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OpenAIError(400, f"'{name}' must be an integer of at least 1, got {value!r}", name)
    return value


def _flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OpenAIError(400, f"'{name}' must be true or false, got {value!r}", name)
    return value


def _completion_prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    raise OpenAIError(
        400, "'prompt' must be a string, a list of one string, or a list of token ids", "prompt"
    )


def _message_text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):  # fmt: skip
                raise OpenAIError(
                    400, f"messages[{index}].content: only text parts are supported", "messages"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise OpenAIError(400, f"messages[{index}].content must be a string or a list of parts",
                      "messages")  # fmt: skip


def _chat_messages(body: dict[str, Any]) -> list[ChatMessage]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "'messages' must be a non-empty list", "messages")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(
                400, f"messages[{index}] must be an object with a string 'role'", "messages"
            )
        parsed.append(ChatMessage(message["role"], _message_text(message.get("content"), index)))
    return parsed


def _chat_ids(
    tokenizer: Tokenizer, body: dict[str, Any], messages: Sequence[ChatMessage]
) -> list[int]:
    """A chat's prompt ids: the model's chat template rendered and tokenized where the engine
    has one (as vLLM and SGLang do), else the simulator's own framing (prompt_ids.py)."""
    template = tokenizer.chat_template
    if template is None:
        return chat_token_ids(tokenizer, messages)
    tools = body.get("tools")
    try:
        chat = template_chat(
            body["messages"],
            [m.content for m in messages],
            tools if isinstance(tools, list) else None,
        )
        return tokenizer.encode(template.render(chat))
    except ChatTemplateError as error:
        raise OpenAIError(400, str(error), "messages") from None


@dataclass(frozen=True)
class _PromptTokens:
    count: int
    block_hashes: tuple[int, ...]
    ids: Sequence[int]


def _prompt_tokens(ids: Sequence[int]) -> _PromptTokens:
    return _PromptTokens(len(ids), block_hashes(ids, KV_BLOCK_TOKENS), ids)


async def _count(length: int, count: Callable[[], T]) -> T:
    """Count on the loop when cheap, in a worker thread when a long prompt would stall it."""
    if length > OFF_LOOP_CHARS:
        return await asyncio.to_thread(count)
    return count()


async def parse_generation(
    request: web.Request, endpoint: ApiRoute, settings: SimSettings, tokenizer: Tokenizer
) -> GenerationRequest:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OpenAIError(400, f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(400, "'model' must be a string", "model")
    if model != settings.model:
        raise OpenAIError(404, f"The model `{model}` does not exist.", "model")
    n = body.get("n", 1)
    if n not in (None, 1) or isinstance(n, bool):
        raise OpenAIError(400, "'n' must be 1: the simulator returns one choice", "n")
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise OpenAIError(400, "'stream_options' must be an object", "stream_options")
    include_usage = _flag(options, "include_usage")

    if endpoint == "completions":
        prompt = _completion_prompt(body)
        if isinstance(prompt, list):
            tokens = _prompt_tokens(prompt)
        else:
            text = prompt
            tokens = await _count(len(text), lambda: _prompt_tokens(tokenizer.encode_prompt(text)))
        max_tokens = _positive_int(body, "max_tokens") or COMPLETIONS_DEFAULT_MAX_TOKENS
    else:
        messages = _chat_messages(body)
        length = sum(len(m.content) for m in messages)
        tokens = await _count(length, lambda: _prompt_tokens(_chat_ids(tokenizer, body, messages)))
        max_tokens = (
            _positive_int(body, "max_completion_tokens")
            or _positive_int(body, "max_tokens")
            or max(1, min(CHAT_DEFAULT_MAX_TOKENS, settings.scheduler.max_context - tokens.count))
        )
    return GenerationRequest(
        endpoint,
        max(1, tokens.count),
        max_tokens,
        stream,
        include_usage,
        _priority(body),
        tokens.block_hashes,
        tokens.ids,
    )


# -- responses ---------------------------------------------------------------------------


def _usage(parsed: GenerationRequest, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": parsed.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": parsed.prompt_tokens + completion_tokens,
    }


def _word(index: int) -> str:
    return OUTPUT_WORDS[index % len(OUTPUT_WORDS)]


@dataclass(frozen=True)
class _Reply:
    request_id: str
    created: int
    model: str
    parsed: GenerationRequest

    def envelope(self, chunk: bool) -> dict[str, Any]:
        if self.parsed.endpoint == "completions":
            kind = "text_completion"
        else:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def token_chunk(self, event: TokenEvent) -> dict[str, Any]:
        finish = "length" if event.last else None
        if self.parsed.endpoint == "completions":
            choice = {"index": 0, "text": _word(event.index), "logprobs": None,
                      "finish_reason": finish}  # fmt: skip
        else:
            choice = {"index": 0, "delta": {"content": _word(event.index)}, "logprobs": None,
                      "finish_reason": finish}  # fmt: skip
        return {**self.envelope(True), "choices": [choice]}

    def role_chunk(self) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self.envelope(True), "choices": [choice]}

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        return {
            **self.envelope(True),
            "choices": [],
            "usage": _usage(self.parsed, completion_tokens),
        }

    def whole(self, completion_tokens: int) -> dict[str, Any]:
        text = "".join(_word(i) for i in range(completion_tokens))
        if self.parsed.endpoint == "completions":
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                      "finish_reason": "length", "stop_reason": None}  # fmt: skip
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length"}  # fmt: skip
        return {**self.envelope(False), "choices": [choice],
                "usage": _usage(self.parsed, completion_tokens)}  # fmt: skip


async def _sse(response: web.StreamResponse, payload: dict[str, Any] | str) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())


async def _stream(
    request: web.Request, reply: _Reply, events: asyncio.Queue[TokenEvent]
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    emitted = 0
    while True:
        event = await events.get()
        if emitted == 0 and reply.parsed.endpoint == "chat":
            # The role chunk goes out with the first output, not on arrival: vLLM sends it in
            # the first pass of its loop over engine outputs (`chat_completion_stream_generator`
            # in vllm/entrypoints/openai/serving_chat.py) and SGLang the same way
            # (`_generate_chat_stream` in python/sglang/srt/entrypoints/openai/serving_chat.py).
            await _sse(response, reply.role_chunk())
        emitted += 1
        await _sse(response, reply.token_chunk(event))
        if event.last:
            break
    if reply.parsed.include_usage:
        await _sse(response, reply.usage_chunk(emitted))
    await _sse(response, "[DONE]")
    await response.write_eof()
    return response


async def _generate(request: web.Request, endpoint: ApiRoute) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    engine = request.app[ENGINE]
    parsed = await parse_generation(request, endpoint, settings, request.app[TOKENIZER])
    prefix = "cmpl" if endpoint == "completions" else "chatcmpl"
    reply = _Reply(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), settings.model, parsed)
    try:
        events = engine.submit(
            reply.request_id,
            parsed.prompt_tokens,
            parsed.max_tokens,
            parsed.priority,
            parsed.block_hashes,
            parsed.token_ids,
        )
    except RequestRejected as error:
        raise OpenAIError(400, str(error)) from None
    try:
        if parsed.stream:
            return await _stream(request, reply, events)
        emitted = 0
        while not (await events.get()).last:
            emitted += 1
        return web.json_response(reply.whole(emitted + 1))
    finally:
        # A no-op once the request has finished; frees the engine when the client left.
        engine.abort(reply.request_id)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def models(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    card = {
        "id": settings.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "laneway-sim",
        "root": settings.model,
        "max_model_len": settings.scheduler.max_context,
    }
    return web.json_response({"object": "list", "data": [card]})


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's and SGLang's `/tokenize`: the prompt's count as this engine counts it.

    vLLM takes `prompt` (a string) or `messages` (framed as for a chat completion); SGLang
    takes `prompt` as a string or a list of strings, and answers a list per string. Both
    answer `count`, `tokens` and `max_model_len`. A chat is rendered through the model's chat
    template when the simulator has one (`--chat-template`), with the generation prompt, as
    vLLM's default `add_generation_prompt` does; without one its framing is the simulator's
    own count (no text to tokenize), and the answer carries the count without token ids.
    """
    try:
        body = await request.json()
    except ValueError:
        raise OpenAIError(400, "The request body is not valid JSON", None) from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object", None)
    tokenizer = request.app[TOKENIZER]
    max_model_len = request.app[SETTINGS].scheduler.max_context
    if "messages" in body:
        messages = _chat_messages(body)
        length = sum(len(m.content) for m in messages)
        if tokenizer.chat_template is None:
            count = await _count(length, lambda: count_chat(tokenizer, messages))
            return web.json_response({"count": count, "max_model_len": max_model_len})
        ids = await _count(length, lambda: _chat_ids(tokenizer, body, messages))
        return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": max_model_len})
    prompt = body.get("prompt")
    # Both engines add the prompt's special tokens (a BOS) unless told not to, as on
    # /v1/completions.
    specials = _flag(body, "add_special_tokens", default=True)
    encode = tokenizer.encode_prompt if specials else tokenizer.encode
    if isinstance(prompt, str):
        tokens = await _count(len(prompt), lambda: encode(prompt))
        return web.json_response(
            {"count": len(tokens), "tokens": tokens, "max_model_len": max_model_len}
        )
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        length = sum(len(p) for p in prompt)
        each = await _count(length, lambda: [encode(p) for p in prompt])
        return web.json_response(
            {"count": [len(t) for t in each], "tokens": each, "max_model_len": max_model_len}
        )
    raise OpenAIError(
        400, "Give 'prompt' (a string or a list of strings) or 'messages' to tokenize", "prompt"
    )


async def health(request: web.Request) -> web.Response:
    return web.Response()


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ENGINE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except OpenAIError as error:
        return error_response(error.status, error.message, error.param)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return error_response(error.status, error.reason)


# -- application ---------------------------------------------------------------------------

SETTINGS = web.AppKey("settings", SimSettings)
ENGINE = web.AppKey("engine", RealTimeEngine)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)


async def _engine_task(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    publisher = ZmqEventPublisher(settings.kv_events) if settings.kv_events else None
    core = EngineCore(settings.profile, settings.scheduler, record_cache_events=bool(publisher))
    engine = RealTimeEngine(
        core, settings.time_scale, settings.metrics_flavor, settings.model, publisher
    )
    app[ENGINE] = engine
    task = asyncio.create_task(engine.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if publisher is not None:
        publisher.close()


def create_app(settings: SimSettings, tokenizer: Tokenizer | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
    app[SETTINGS] = settings
    app[TOKENIZER] = tokenizer or default_tokenizer()
    app.cleanup_ctx.append(_engine_task)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(
    settings: SimSettings, host: str, port: int, tokenizer: Tokenizer | None = None
) -> None:
    """Serve until SIGTERM or SIGINT; print the ready line once listening."""
    app = create_app(settings, tokenizer)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as error:
            raise cannot_listen(host, port, error) from None
        bound_port = runner.addresses[0][1]
        print(f"laneway sim: serving {settings.model} on http://{host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        print("laneway sim: stopping", file=sys.stderr, flush=True)
    finally:
        await runner.cleanup()
