"""`laneway sim`: one simulated engine behind an OpenAI-compatible aiohttp server.

The engine core (scheduler, KV cache, cost model) runs in real time (realtime.py): a
background task takes one step, sleeps the step's duration divided by the time scale, and
then hands the step's tokens to the requests' streams. The routes here only parse and count
(openai_framing.py), submit, and relay what the engine emits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from laneway.api import MetricsFlavor
from laneway.errors import cannot_listen
from laneway.simulator.engine import EngineCore, RequestRejected
from laneway.simulator.kv_events import KVEventsConfig, ZmqEventPublisher
from laneway.simulator.openai_framing import (
    ApiRoute,
    OpenAIError,
    Reply,
    chat_ids,
    chat_messages,
    error_response,
    flag,
    off_loop,
    parse_generation,
)
from laneway.simulator.profiles import Profile
from laneway.simulator.realtime import RealTimeEngine, TokenEvent
from laneway.simulator.responses import (
    ResponseReply,
    ResponseStore,
    not_found,
    parse_responses,
    sse_event,
)
from laneway.simulator.scheduler import SchedulerConfig
from laneway.tokens import Tokenizer, count_chat, default_tokenizer

MAX_BODY_BYTES = 64 * 1024 * 1024  # a 128k-token prompt is about 0.6 MB; leave room


@dataclass(frozen=True)
class SimSettings:
    model: str
    profile: Profile
    scheduler: SchedulerConfig
    metrics_flavor: MetricsFlavor = MetricsFlavor.VLLM
    time_scale: float = 1.0
    kv_events: KVEventsConfig | None = None  # --kv-events-config; None: not published
    # --enable-responses-store: vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1 (responses.py)
    responses_store: bool = False


async def _sse(response: web.StreamResponse, payload: dict[str, Any] | str) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())


async def _stream(
    request: web.Request, reply: Reply, events: asyncio.Queue[TokenEvent]
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    emitted, cached = 0, 0
    while True:
        event = await events.get()
        cached = event.cached_tokens
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
        await _sse(response, reply.usage_chunk(emitted, cached))
    await _sse(response, "[DONE]")
    await response.write_eof()
    return response


async def _generate(request: web.Request, endpoint: ApiRoute) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    engine = request.app[ENGINE]
    parsed = await parse_generation(
        await request.read(),
        endpoint,
        settings.model,
        settings.scheduler.max_context,
        request.app[TOKENIZER],
    )
    prefix = "cmpl" if endpoint == "completions" else "chatcmpl"
    reply = Reply(
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=settings.model,
        parsed=parsed,
    )
    try:
        events = engine.submit(
            reply.request_id,
            parsed.prompt_tokens,
            parsed.max_tokens,
            priority=parsed.priority,
            prompt_block_hashes=parsed.block_hashes,
            prompt_token_ids=parsed.token_ids,
        )
    except RequestRejected as error:
        raise OpenAIError(400, str(error)) from None
    try:
        if parsed.stream:
            return await _stream(request, reply, events)
        emitted = 1
        while not (event := await events.get()).last:
            emitted += 1
        return web.json_response(reply.whole(emitted, event.cached_tokens))
    finally:
        # A no-op once the request has finished; frees the engine when the client left.
        engine.abort(reply.request_id)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def create_response(request: web.Request) -> web.StreamResponse:
    """`POST /v1/responses` (responses.py says how vLLM frames it)."""
    settings, engine, store = request.app[SETTINGS], request.app[ENGINE], request.app[RESPONSES]
    parsed = await parse_responses(
        await request.read(),
        settings.model,
        settings.scheduler.max_context,
        request.app[TOKENIZER],
        store,
    )
    reply = ResponseReply(request=parsed, model=settings.model, created=int(time.time()))
    generation = parsed.generation
    try:
        events = engine.submit(
            reply.response_id,
            generation.prompt_tokens,
            generation.max_tokens,
            priority=generation.priority,
            prompt_block_hashes=generation.block_hashes,
            prompt_token_ids=generation.token_ids,
        )
    except RequestRejected as error:
        raise OpenAIError(400, str(error), error_type="invalid_request_error") from None
    try:
        if generation.stream:
            return await _stream_response(request, reply, events, store)
        emitted = 0
        while not (await events.get()).last:
            emitted += 1
        # Run to its max_output_tokens, as every simulated request is: vLLM's "incomplete"
        # (ResponseReply.closing), whether streamed or not.
        answer = reply.response("incomplete", emitted + 1)
        if parsed.store:
            store.held[reply.response_id] = reply.kept(answer)
        return web.json_response(answer)
    finally:
        engine.abort(reply.response_id)


async def _stream_response(
    request: web.Request,
    reply: ResponseReply,
    events: asyncio.Queue[TokenEvent],
    store: ResponseStore,
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    sequence = 0

    async def send(event: dict[str, Any]) -> None:
        nonlocal sequence
        await response.write(sse_event(event, sequence))
        sequence += 1

    for event in reply.opening():
        await send(event)
    emitted = 0
    while True:
        token = await events.get()
        await send(reply.delta(token.index))
        emitted += 1
        if token.last:
            break
    closing = reply.closing(emitted)
    if reply.request.store:
        store.held[reply.response_id] = reply.kept(closing[-1]["response"])
    for event in closing:
        await send(event)
    await response.write_eof()
    return response


async def retrieve_response(request: web.Request) -> web.Response:
    """`GET /v1/responses/{id}`: a stored response (vLLM's `retrieve_responses`)."""
    stored = request.app[RESPONSES].get(request.match_info["response_id"])
    return web.json_response(stored.response)


async def cancel_response(request: web.Request) -> web.Response:
    """`POST /v1/responses/{id}/cancel` (vLLM's `cancel_responses`): only a background
    response still queued or running can be; none is, here."""
    response_id = request.match_info["response_id"]
    if response_id not in request.app[RESPONSES].held:
        raise not_found(response_id)
    raise OpenAIError(
        400, "Cannot cancel a synchronous response.", error_type="invalid_request_error"
    )


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
        messages = chat_messages(body)
        length = sum(len(m.content) for m in messages)
        if tokenizer.chat_template is None:
            count = await off_loop(length, lambda: count_chat(tokenizer, messages))
            return web.json_response({"count": count, "max_model_len": max_model_len})
        ids = await off_loop(length, lambda: chat_ids(tokenizer, body, messages))
        return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": max_model_len})
    prompt = body.get("prompt")
    # Both engines add the prompt's special tokens (a BOS) unless told not to, as on
    # /v1/completions.
    specials = flag(body, "add_special_tokens", default=True)
    encode = tokenizer.encode_prompt if specials else tokenizer.encode
    if isinstance(prompt, str):
        tokens = await off_loop(len(prompt), lambda: encode(prompt))
        return web.json_response(
            {"count": len(tokens), "tokens": tokens, "max_model_len": max_model_len}
        )
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        length = sum(len(p) for p in prompt)
        each = await off_loop(length, lambda: [encode(p) for p in prompt])
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
        return error_response(error.status, error.message, error.param, error.error_type)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return error_response(error.status, error.reason)


# -- application ---------------------------------------------------------------------------

SETTINGS = web.AppKey("settings", SimSettings)
ENGINE = web.AppKey("engine", RealTimeEngine)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
RESPONSES = web.AppKey("responses", ResponseStore)


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
    app[RESPONSES] = ResponseStore(enabled=settings.responses_store)
    app.cleanup_ctx.append(_engine_task)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
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
