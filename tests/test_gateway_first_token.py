"""The gateway's TTFT is the first event carrying output, however the engine frames its stream.

The pure part is table-driven; the rest runs `laneway gateway` against scripted engines on
loopback, each framing its stream one way: the role chunk on arrival (older servers), the role
chunk with the first token (vLLM and SGLang today), a tool call first, a completions stream.
Each engine holds its first output back for FIRST_TOKEN_AFTER_S, so a gateway that timed an
earlier, empty event would report a first token well inside the pool's 300 ms SLO.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from support.client import requests_by_status, scrape, total
from support.engines import Script, scripted_engine
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.procs import ChildProcess, Children
from laneway.gateway.serving.first_token import FirstTokenWatch, carries_output
from laneway.gateway.serving.protocol import GatewayProtocol
from laneway.routing.slo import PRIOR_MS_PER_TOKEN

in_the_rigs_loop = pytest.mark.asyncio(loop_scope="module")

FIRST_TOKEN_AFTER_S = 0.4  # above the pools' default 300 ms TTFT SLO
HEAD_PAUSE_S = 1.0  # a client that sends its request's head in two parts waits this between
IDLE_S = 3.0  # a keep-alive connection rests this long between two requests
# About 600 prompt tokens: enough backlog for the gateway to learn a prefill rate from.
QUESTION = "Which of the parcels in my last order left the warehouse, and when? " * 40


def event(**choice: Any) -> bytes:
    choices = [{"index": 0, "logprobs": None, "finish_reason": None, **choice}]
    document = {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": choices}
    return b"data: " + json.dumps(document).encode() + b"\n\n"


ROLE = event(delta={"role": "assistant", "content": ""})
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5}}\n\n'
DONE = b"data: [DONE]\n\n"

OUTPUT_LINES = [
    # (case, one SSE line, whether it carries output)
    ("the chat role chunk", ROLE, False),
    ("a chat token", event(delta={"content": " lorem"}), True),
    ("an empty chat delta (SGLang's finish chunk)", event(delta={}, finish_reason="stop"), False),
    ("a tool call", event(delta={"tool_calls": [{"index": 0, "id": "t"}]}), True),
    ("reasoning text", event(delta={"reasoning_content": "hmm"}), True),
    ("logprobs alone", event(delta={}, logprobs={"content": [{"token": "a"}]}), True),
    ("null logprobs content", event(delta={}, logprobs={"content": None}), False),
    ("a completions token", event(text=" ipsum"), True),
    ("an empty completions text", event(text=""), False),
    ("a usage chunk", USAGE, False),
    ("the end marker", DONE, False),
    ("a comment (keep-alive)", b": ping\n", False),
    ("not JSON", b"data: {oops\n", False),
    ("an error event", b'data: {"error": {"message": "boom"}}\n', False),
]


@pytest.mark.parametrize(
    ("line", "expected"), [c[1:] for c in OUTPUT_LINES], ids=[c[0] for c in OUTPUT_LINES]
)
def test_which_lines_carry_output(line: bytes, expected: bool) -> None:
    assert carries_output(line) is expected


def test_the_watch_names_the_chunk_that_completes_the_first_token_wherever_it_splits() -> None:
    stream = ROLE + event(delta={"content": " lorem"}) + event(delta={"content": " ipsum"}) + DONE
    first_end = len(ROLE) + len(event(delta={"content": " lorem"}))
    for cut in range(1, len(stream)):
        watch = FirstTokenWatch()
        verdicts = [watch.feed(stream[:cut]), watch.feed(stream[cut:])]
        # The token's line ends at first_end - 2 (its "\n\n" follows).
        assert verdicts == ([True, False] if cut >= first_end - 1 else [False, True]), cut


async def test_a_request_is_stamped_with_its_first_bytes_and_only_those() -> None:
    now = [0.0]

    async def unused(request: web.BaseRequest) -> web.StreamResponse:
        raise AssertionError("no request is handled here")

    loop = asyncio.get_running_loop()
    stamps = GatewayProtocol(web.Server(unused), clock=lambda: now[0], loop=loop)
    assert stamps.claim() is None  # nothing read yet
    stamps.release()
    head = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 20\r\n\r\n"
    for at, data in ((1.0, head[:9]), (2.0, head[9:])):
        now[0] = at
        stamps.data_received(data)
    assert stamps.claim() == 1.0  # the head's first bytes, not its last
    now[0] = 3.0
    stamps.data_received(b"the rest of the body")  # read while the request is handled
    stamps.release()
    assert stamps.claim() is None  # the body's bytes started no request
    stamps.release()
    now[0] = 9.0
    stamps.data_received(b"GET /healthz")  # the next request on the connection
    assert stamps.claim() == 9.0


# --- through the gateway --------------------------------------------------------------------


async def role_on_arrival(response: web.StreamResponse) -> None:
    await response.write(ROLE)
    await asyncio.sleep(FIRST_TOKEN_AFTER_S)
    for word in (" lorem", " ipsum", " dolor"):
        await response.write(event(delta={"content": word}))
    await response.write(DONE)


async def role_with_the_first_token(response: web.StreamResponse) -> None:
    await asyncio.sleep(FIRST_TOKEN_AFTER_S)
    await response.write(ROLE + event(delta={"content": " lorem"}))
    for word in (" ipsum", " dolor"):
        await response.write(event(delta={"content": word}))
    await response.write(USAGE + DONE)


async def tool_call_first(response: web.StreamResponse) -> None:
    await response.write(ROLE)
    await asyncio.sleep(FIRST_TOKEN_AFTER_S)
    call = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "track"}}
    await response.write(event(delta={"tool_calls": [call]}))
    await response.write(event(delta={}, finish_reason="tool_calls") + DONE)


async def completions(response: web.StreamResponse) -> None:
    await asyncio.sleep(FIRST_TOKEN_AFTER_S)
    for word in (" lorem", " ipsum", " dolor"):
        await response.write(event(text=word))
    await response.write(DONE)


async def lingers_after_done(response: web.StreamResponse) -> None:
    """The whole answer, then a long wait before the end of the stream."""
    await response.write(ROLE + event(delta={"content": " lorem"}) + DONE)
    await asyncio.sleep(30)


async def stalls_mid_answer(response: web.StreamResponse) -> None:
    await response.write(ROLE + event(delta={"content": " lorem"}))
    await asyncio.sleep(30)
    await response.write(DONE)


SCRIPTS: dict[str, Script] = {
    "role-on-arrival": role_on_arrival,
    "role-with-first-token": role_with_the_first_token,
    # Pools of their own for the tests of where the clock starts: each counts its streams.
    "slow-head": role_with_the_first_token,
    "after-idle": role_with_the_first_token,
    "tool-call-first": tool_call_first,
    "completions": completions,
    "lingers": lingers_after_done,
    "stalls": stalls_mid_answer,
}


@dataclass(frozen=True)
class Rig:
    gateway: ChildProcess


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    runners = []
    documents = []
    try:
        for name, script in SCRIPTS.items():
            runner = web.AppRunner(scripted_engine(script), handler_cancellation=True)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            document = pool_doc(name, "interactive", name, [url], routing={"models": [name]})
            documents.append(document)
        path = Path(tmp_path_factory.mktemp("first-token")) / "gateway.yaml"
        path.write_text(yaml.safe_dump_all([*documents, gateway_doc()]))
        with Children() as children:
            args = ["--config", str(path), "--host", "127.0.0.1", "--port", "0"]
            yield Rig(await children.start_laneway_async("gateway", args))
    finally:
        for runner in runners:
            await runner.cleanup()


def body(model: str) -> dict[str, Any]:
    if model == "completions":
        return {"model": model, "prompt": QUESTION, "max_tokens": 3, "stream": True}
    messages = [{"role": "user", "content": QUESTION}]
    return {"model": model, "messages": messages, "max_tokens": 3, "stream": True}


def path_of(model: str) -> str:
    return "/v1/completions" if model == "completions" else "/v1/chat/completions"


@in_the_rigs_loop
@pytest.mark.parametrize("framing", ["role-on-arrival", "role-with-first-token",
                                     "tool-call-first", "completions"])  # fmt: skip
async def test_ttft_its_slo_count_and_the_learned_rate_wait_for_output(
    rig: Rig, framing: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rig.gateway.url}{path_of(framing)}", json=body(framing)) as response,
    ):
        assert response.status == 200
        relayed = await response.read()
        prompt_tokens = int(response.headers["x-laneway-prompt-tokens"])
    assert relayed.endswith(DONE)
    samples = await scrape(rig.gateway.url)
    pool = {"pool": framing, "lane": "interactive"}
    assert total(samples, "laneway_gateway_ttft_seconds_count", **pool) == 1
    assert total(samples, "laneway_gateway_ttft_seconds_sum", **pool) >= FIRST_TOKEN_AFTER_S
    assert total(samples, "laneway_gateway_slo_ttft_total", met="false", **pool) == 1
    assert total(samples, "laneway_gateway_slo_ttft_total", met="true", **pool) == 0
    # The prior counts as one observation; the first stream's TTFT per backlog token is the
    # other half, and that TTFT is at least FIRST_TOKEN_AFTER_S.
    learned_s = total(samples, "laneway_gateway_endpoint_prefill_seconds_per_token", pool=framing)
    learned = learned_s * 1000
    assert prompt_tokens >= 256
    assert learned >= (PRIOR_MS_PER_TOKEN + FIRST_TOKEN_AFTER_S * 1000 / prompt_tokens) / 2


async def leave_after(rig: Rig, model: str, marker: bytes) -> dict[str, float]:
    """Read the stream until `marker`, close the connection, and wait for the count."""
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{rig.gateway.url}{path_of(model)}", json=body(model))
        seen = b""
        while marker not in seen:
            seen += await response.content.readany()
        response.close()
    async with asyncio.timeout(30):
        # Polling another process over HTTP: there is no event to wait on.
        while not (counted := await requests_by_status(rig.gateway, model)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return counted


@in_the_rigs_loop
async def test_a_client_that_leaves_after_the_end_marker_is_no_499(rig: Rig) -> None:
    assert await leave_after(rig, "lingers", DONE) == {"200": 1}


@in_the_rigs_loop
async def test_a_client_that_leaves_mid_answer_is_a_499(rig: Rig) -> None:
    assert await leave_after(rig, "stalls", b"lorem") == {"499": 1}


async def ttft_seconds(gateway: ChildProcess, pool: str) -> tuple[float, float]:
    """The gateway's TTFT histogram count and sum for one pool."""
    samples = await scrape(gateway.url)
    labels = {"pool": pool, "lane": "interactive"}
    return (
        total(samples, "laneway_gateway_ttft_seconds_count", **labels),
        total(samples, "laneway_gateway_ttft_seconds_sum", **labels),
    )


@in_the_rigs_loop
async def test_the_clock_starts_when_the_request_s_first_bytes_arrive(rig: Rig) -> None:
    """A head sent in two parts: the handler starts after the second, the client's clock
    (and the gateway's) at the first."""
    payload = json.dumps(body("slow-head")).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    host, port = rig.gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head[:16])
        await writer.drain()
        await asyncio.sleep(HEAD_PAUSE_S)
        writer.write(head[16:] + payload)
        await writer.drain()
        async with asyncio.timeout(60):
            answer = await reader.readuntil(b"[DONE]")
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200")
    count, seconds = await ttft_seconds(rig.gateway, "slow-head")
    assert count == 1
    assert seconds >= HEAD_PAUSE_S + FIRST_TOKEN_AFTER_S


@in_the_rigs_loop
async def test_a_request_after_an_idle_keep_alive_is_timed_from_its_own_bytes(rig: Rig) -> None:
    """A stamp left by an earlier request on the connection would add the idle time."""
    connector = aiohttp.TCPConnector(limit=1)  # one connection: the second request reuses it
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(f"{rig.gateway.url}/healthz") as health:
            assert health.status == 200
        await asyncio.sleep(IDLE_S)
        async with session.post(
            f"{rig.gateway.url}{path_of('after-idle')}", json=body("after-idle")
        ) as response:
            assert response.status == 200
            await response.read()
    count, seconds = await ttft_seconds(rig.gateway, "after-idle")
    assert count == 1
    assert FIRST_TOKEN_AFTER_S <= seconds < IDLE_S
