"""The gateway's HTTP/1.1 as clients meet it: aiohttp's server, with the gateway's limits,
its OpenAI-shaped refusals and its arrival stamps (`gateway/serving/protocol.py`).

A real `laneway gateway` with a `laneway sim` engine, spoken to over loopback: through
`http.client` and the official openai client, and byte by byte on raw sockets where the
test is about the framing (pipelining, HTTP/1.0, bad heads). Nothing here is timed: a
deadline only bounds a wait for what must happen.
"""

from __future__ import annotations

import gzip
import http.client
import json
import select
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import openai
import pytest
from support.launch import start_gateway, start_sim
from support.pools import MAX_BODY, gateway_doc, pool_doc

from laneway.bench.harness.procs import ChildProcess, Children

PATIENCE = 120.0
CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
TEXT = {"model": "llama", "prompt": "hi", "max_tokens": 3}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildProcess]:
    with Children() as children:
        yield start(children, tmp_path_factory.mktemp("server"), {})


def start(children: Children, where: Path, clients: dict[str, int]) -> ChildProcess:
    engine = start_sim(children, "llama-small", "--time-scale", "1000")
    pool = pool_doc("solo", "interactive", "llama-small", [engine.url])
    return start_gateway(children, where / "gateway.yaml", [pool, gateway_doc(clients=clients)])


def address(gateway: ChildProcess) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(gateway.url)
    assert parsed.hostname is not None
    assert parsed.port is not None
    return parsed.hostname, parsed.port


def connect(gateway: ChildProcess) -> socket.socket:
    sock = socket.create_connection(address(gateway), timeout=PATIENCE)
    return sock


def post_bytes(path: str, body: dict[str, Any], version: str = "1.1", **headers: str) -> bytes:
    encoded = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/{version}", "Host: gateway", f"Content-Length: {len(encoded)}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + encoded


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def read_answer(stream: BinaryIO) -> Answer:
    """One response off `stream`, framed by Content-Length, chunks, or the connection's end."""
    status_line = stream.readline()
    # aiohttp answers an HTTP/1.0 request, and one it cannot parse, in HTTP/1.0.
    assert status_line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), status_line
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = stream.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while size := int(stream.readline().split(b";")[0], 16):
            parts.append(stream.read(size))
            stream.readline()
        stream.readline()
        body = b"".join(parts)
    else:
        body = stream.read()
    return Answer(int(status_line.split()[1]), headers, body)


def closed(stream: BinaryIO) -> bool:
    try:
        return stream.read(1) == b""
    except ConnectionError:
        return True


def test_one_connection_carries_many_requests(gateway: ChildProcess) -> None:
    connection = http.client.HTTPConnection(*address(gateway), timeout=PATIENCE)
    connection.connect()
    sock = connection.sock
    for index in range(40):
        path, body = ("/v1/chat/completions", CHAT) if index % 2 else ("/v1/completions", TEXT)
        stream = index % 3 == 0
        connection.request("POST", path, json.dumps({**body, "stream": stream}))
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200, answer
        assert response.getheader("x-laneway-pool") == "solo"
        if stream:
            assert response.getheader("Content-Type") == "text/event-stream"
            assert response.getheader("Cache-Control") == "no-cache"
            assert answer.rstrip().endswith(b"data: [DONE]")
        else:
            assert json.loads(answer)["usage"]["completion_tokens"] == 3
    assert connection.sock is sock  # never reconnected
    connection.close()


def test_other_routes_share_the_connection(gateway: ChildProcess) -> None:
    connection = http.client.HTTPConnection(*address(gateway), timeout=PATIENCE)
    connection.request("POST", "/v1/completions", json.dumps(TEXT))
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    sock = connection.sock
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    assert json.loads(response.read()) == {"status": "ok"}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)):
        connection.request("POST", path, json.dumps(body))
        response = connection.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["usage"]["completion_tokens"] == 3
        assert response.getheader("x-laneway-pool") == "solo"
    connection.request("GET", "/v1/nothing")
    missing = connection.getresponse()
    assert missing.status == 404
    assert json.loads(missing.read())["error"]["type"] == "not_found_error"
    assert connection.sock is sock
    connection.close()


def test_an_upgrade_and_an_encoded_body_are_served(gateway: ChildProcess) -> None:
    body = json.dumps(TEXT).encode()
    for extra in (
        b"Connection: Upgrade\r\nUpgrade: h2c\r\n",  # an upgrade
        b"Content-Encoding: gzip\r\n",  # a body to decode
    ):
        sent = gzip.compress(body) if b"gzip" in extra else body
        with connect(gateway) as sock, sock.makefile("rb") as stream:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n"
                + extra
                + b"Content-Length: %d\r\n\r\n" % len(sent)
                + sent
            )
            answer = read_answer(stream)
            assert answer.status == 200, answer.body
            assert answer.json()["usage"]["completion_tokens"] == 3


def test_pipelined_requests_are_answered_in_order(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            post_bytes("/v1/completions", {**TEXT, "max_tokens": 5})
            + post_bytes("/v1/chat/completions", {**CHAT, "stream": True})
            + post_bytes("/v1/completions", {**TEXT, "max_tokens": 1})
        )
        first, second, third = (read_answer(stream) for _ in range(3))
        assert first.json()["usage"]["completion_tokens"] == 5
        assert second.headers["content-type"] == "text/event-stream"
        assert second.body.rstrip().endswith(b"data: [DONE]")
        assert third.json()["usage"]["completion_tokens"] == 1
        # The connection is still open for more.
        sock.sendall(post_bytes("/v1/completions", TEXT))
        assert read_answer(stream).status == 200


def test_another_route_pipelined_behind_a_completion_is_answered_after_it(
    gateway: ChildProcess,
) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            post_bytes("/v1/completions", TEXT) + b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"
        )
        assert read_answer(stream).json()["usage"]["completion_tokens"] == 3
        assert read_answer(stream).json() == {"status": "ok"}


def test_another_route_sent_while_a_stream_runs_is_answered_after_it(
    gateway: ChildProcess,
) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            post_bytes("/v1/chat/completions", {**CHAT, "max_tokens": 2000, "stream": True})
        )
        assert stream.readline() == b"HTTP/1.1 200 OK\r\n"  # the stream has begun...
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")  # ...a read of its own
        while stream.readline() != b"\r\n":
            pass  # the rest of the stream's head
        body = []
        while size := int(stream.readline(), 16):
            body.append(stream.read(size))
            stream.readline()
        stream.readline()
        assert b"".join(body).rstrip().endswith(b"data: [DONE]")
        health = read_answer(stream)
        assert health.json() == {"status": "ok"}


def test_a_chunked_body_is_read_whole(gateway: ChildProcess) -> None:
    body = json.dumps({**CHAT, "max_tokens": 4}).encode()
    parts = [body[i : i + 7] for i in range(0, len(body), 7)]
    connection = http.client.HTTPConnection(*address(gateway), timeout=PATIENCE)
    connection.request(
        "POST",
        "/v1/chat/completions",
        iter(parts),
        {"Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["usage"]["completion_tokens"] == 4
    connection.close()


def assert_too_large_then_closed(stream: BinaryIO) -> None:
    """The next answer on `stream` is the 413 for a body past maxBodyBytes, and the last."""
    answer = read_answer(stream)
    assert answer.status == 413
    assert answer.json()["error"]["code"] == "body_too_large"
    assert answer.headers["connection"] == "close"
    assert closed(stream)


def test_a_chunked_body_past_the_limit_is_413_and_closes(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        piece = b"x" * 65536
        sent = 0
        try:
            while sent <= MAX_BODY:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
        except ConnectionError:
            pass  # the gateway may answer and close before all of it is sent
        assert_too_large_then_closed(stream)


def test_a_body_declared_past_the_limit_is_413_before_it_is_sent(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nExpect: 100-continue\r\n"
            + f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        )
        # No "100 Continue" first: the body is not wanted.
        assert_too_large_then_closed(stream)


def test_a_client_still_sending_a_refused_body_reads_its_413(gateway: ChildProcess) -> None:
    """The 413 goes out as soon as the head is read; the client, which does not wait for it,
    sends its body on. Closed at once, the gateway's socket would answer those bytes with a
    reset that can wipe the unread 413 on the client's side: it reads them and drops them."""
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n"
            + f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        )
        readable, _, _ = select.select([sock], [], [], PATIENCE)
        assert readable, "no answer to a head declaring too large a body"
        for _ in range(16):  # after the answer: each lands on a socket the gateway still reads
            sock.sendall(b"x" * 16384)
            time.sleep(0.01)
        assert_too_large_then_closed(stream)


def test_expect_100_continue(gateway: ChildProcess) -> None:
    body = json.dumps(TEXT).encode()
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nExpect: 100-continue\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        assert stream.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert stream.readline() == b"\r\n"
        sock.sendall(body)
        assert read_answer(stream).json()["usage"]["completion_tokens"] == 3


def test_http_1_0(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(post_bytes("/v1/completions", TEXT, version="1.0"))
        answer = read_answer(stream)
        assert answer.json()["usage"]["completion_tokens"] == 3
        # HTTP/1.0 closes unless asked to keep alive: aiohttp says so by saying nothing.
        assert answer.headers.get("connection", "close") == "close"
        assert closed(stream)
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        # No chunked framing for HTTP/1.0: the stream ends with the connection.
        sock.sendall(post_bytes("/v1/chat/completions", {**CHAT, "stream": True}, version="1.0"))
        answer = read_answer(stream)
        assert "transfer-encoding" not in answer.headers
        assert answer.body.rstrip().endswith(b"data: [DONE]")
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        for _ in range(2):
            keep = post_bytes("/v1/completions", TEXT, version="1.0", Connection="keep-alive")
            sock.sendall(keep)
            answer = read_answer(stream)
            assert answer.status == 200
            assert answer.headers["connection"] == "keep-alive"


def test_connection_close_is_honoured(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(post_bytes("/v1/chat/completions", CHAT, Connection="close"))
        answer = read_answer(stream)
        assert answer.status == 200
        assert answer.headers["connection"] == "close"
        assert closed(stream)


@pytest.mark.parametrize(
    "head",
    [
        # A request head over one of aiohttp's limits (a target or a field over 8190 bytes,
        # more than 128 fields), or not HTTP/1.1: each a 400, as aiohttp answers them.
        b"POST /v1/completions?q=" + b"x" * 9000 + b" HTTP/1.1\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nX-Big: " + b"x" * 9000 + b"\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n",
        b"POST /v1/completions HTTP/1.1 extra\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",  # TLS on the HTTP port
        b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n"
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n",
    ],
    ids=["target", "field", "fields", "request-line", "not-http", "two-lengths"],
)
def test_bad_heads_get_an_openai_error_and_a_close(gateway: ChildProcess, head: bytes) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(head)
        answer = read_answer(stream)
        assert answer.status == 400
        error = answer.json()["error"]
        assert error["message"]
        assert error["type"] == "invalid_request_error"
        assert closed(stream)
    with connect(gateway) as sock, sock.makefile("rb") as stream:  # the gateway is fine
        sock.sendall(post_bytes("/v1/completions", TEXT))
        assert read_answer(stream).status == 200


def test_a_field_that_never_ends_is_refused(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nX-Endless: ")
        try:
            for _ in range(64):  # 1 MiB in all, far past the limit
                sock.sendall(b"x" * 16384)
        except ConnectionError:
            pass  # the gateway may answer and close before all of it is sent
        answer = read_answer(stream)
        assert answer.status == 400
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert closed(stream)


CHUNKED_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n"
BAD_CHUNK = b"zz\r\nhi\r\n"


def test_a_bad_chunk_in_a_body_is_400(gateway: ChildProcess) -> None:
    with connect(gateway) as sock, sock.makefile("rb") as stream:
        # Read with its head: aiohttp's parser refuses the whole request.
        sock.sendall(CHUNKED_HEAD + b"\r\n" + BAD_CHUNK)
        answer = read_answer(stream)
        assert answer.status == 400
        assert answer.json()["error"]["code"] == "invalid_request"
        assert closed(stream)


def test_a_bad_chunk_after_the_head_is_answered_by_the_body_deadline(tmp_path: Path) -> None:
    """Read once the request is being handled: aiohttp's parser drops the body it was
    reading without an error, so the request waits out its body deadline."""
    with Children() as children:
        gateway = start(children, tmp_path, {"bodyTimeoutMillis": 500})
        with connect(gateway) as sock, sock.makefile("rb") as stream:
            sock.sendall(CHUNKED_HEAD + b"Expect: 100-continue\r\n\r\n")
            assert stream.readline() == b"HTTP/1.1 100 Continue\r\n"
            assert stream.readline() == b"\r\n"
            sock.sendall(BAD_CHUNK)
            answer = read_answer(stream)
            assert answer.status == 408
            assert answer.json()["error"]["code"] == "body_timeout"
            assert closed(stream)


def test_the_official_client(gateway: ChildProcess) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 4
    with client.chat.completions.with_streaming_response.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    ) as raw:
        assert raw.headers["x-laneway-lane"] == "interactive"
        words = [c.choices[0].delta.content for c in raw.parse() if c.choices]
    assert (
        "".join(w or "" for w in words).split() == (chat.choices[0].message.content or "").split()
    )
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="nobody", prompt="hi", max_tokens=1)
    assert missing.value.code == "model_not_found"


def test_an_idle_connection_is_closed(tmp_path: Path) -> None:
    with Children() as children:
        gateway = start(children, tmp_path, {"idleTimeoutMillis": 300})
        with connect(gateway) as sock, sock.makefile("rb") as stream:
            assert closed(stream)  # said nothing at all
        with connect(gateway) as sock, sock.makefile("rb") as stream:
            sock.sendall(post_bytes("/v1/completions", TEXT))
            assert read_answer(stream).status == 200
            assert closed(stream)  # said nothing after its answer
