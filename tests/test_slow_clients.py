"""Slow and silent clients hold nothing for long; a slow generation does not eject its engine.

Real `laneway gateway` and `laneway sim` processes over loopback. The deadlines are short
settings of the gateway under test; the tests only wait (with generous patience) for what
must eventually happen, and never time how long it took.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.launch import start_gateway, start_sim
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.procs import ChildProcess, Children

PATIENCE = 120.0


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + PATIENCE
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)
    return result


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=PATIENCE) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def start(
    children: Children, tmp_path: Path, time_scale: str, clients: dict[str, int], **spec: Any
) -> tuple[ChildProcess, ChildProcess]:
    """One engine behind a one-slot pool for model "m"; `clients`: the gateway's deadlines."""
    engine = start_sim(children, "m", "--time-scale", time_scale, "--max-context", "65536")
    pool = pool_doc(
        "solo",
        "interactive",
        "m",
        [engine.url],
        routing={"models": ["m"]},
        limits={"maxConcurrentRequests": 1, "maxContextTokens": 65536},
    )
    config = gateway_doc(clients=clients, queue={"timeoutMillis": 1000}, **spec)
    return engine, start_gateway(children, tmp_path / "gateway.yaml", [pool, config])


def connect(gateway: ChildProcess) -> socket.socket:
    parsed = urllib.parse.urlsplit(gateway.url)
    return socket.create_connection((parsed.hostname, parsed.port))


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


@pytest.fixture
def children() -> Iterator[Children]:
    with Children() as running:
        yield running


def test_a_head_sent_a_byte_at_a_time_is_cut_off(children: Children, tmp_path: Path) -> None:
    _, gateway = start(children, tmp_path, "1", {"idleTimeoutMillis": 500})
    with connect(gateway) as trickle:
        trickle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")

        def cut() -> bool:
            try:
                trickle.sendall(b"X")  # another byte of an endless header
            except ConnectionError:
                return True
            return closed_by_peer(trickle)

        wait_for("the gateway to close a connection that never finishes its head", cut)
    # The gateway itself is fine.
    with urllib.request.urlopen(f"{gateway.url}/healthz", timeout=PATIENCE) as response:
        assert response.status == 200


def test_a_stream_nobody_reads_gives_back_its_slot(children: Children, tmp_path: Path) -> None:
    _, gateway = start(children, tmp_path, "1000", {"writeTimeoutMillis": 500})
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "tell me everything " * 50}],
            # Megabytes of events: far more than the sockets between them can buffer.
            "max_tokens": 60000,
            "stream": True,
        }
    ).encode()
    parsed = urllib.parse.urlsplit(gateway.url)
    with connect(gateway) as silent:
        # A tiny receive window: the gateway's writes fill it and then block.
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        silent.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\n"
            + f"Host: {parsed.hostname}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # The pool runs one request at a time: another one gets its answer only once the
        # reader that reads nothing has been cut off.
        short = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        wait_for("the slot of a client that reads nothing", lambda: post_ok(gateway, short))


def post_ok(gateway: ChildProcess, body: dict[str, Any]) -> bool:
    status, _ = post(f"{gateway.url}/v1/chat/completions", body)
    assert status in (200, 429), status  # 429 while the silent stream still holds the slot
    return status == 200


def test_a_generation_longer_than_the_read_timeout_does_not_eject_the_engine(
    children: Children, tmp_path: Path
) -> None:
    engine, gateway = start(
        children,
        tmp_path,
        "1",
        {},
        upstream={"readTimeoutMillis": 200},
        health={"failuresToEject": 1},
    )
    long = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    for _ in range(3):
        status, answer = post(f"{gateway.url}/v1/chat/completions", long)
        assert status == 503, answer  # the answer was cut by the read timeout...
        assert "TimeoutError" in answer["error"]["message"]
    # ...but the engine answered its health probe each time, so it is still in the pool.
    with urllib.request.urlopen(f"{gateway.url}/readyz", timeout=PATIENCE) as response:
        assert response.status == 200
    short = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert post(f"{gateway.url}/v1/chat/completions", short)[0] == 200
    # A dead engine is still ejected at its first failure.
    engine.stop()
    assert post(f"{gateway.url}/v1/chat/completions", short)[0] == 503
    wait_for("the dead engine's ejection", lambda: not_ready(gateway))


def not_ready(gateway: ChildProcess) -> bool:
    try:
        with urllib.request.urlopen(f"{gateway.url}/readyz", timeout=PATIENCE):
            return False
    except urllib.error.HTTPError as error:
        with error:
            return error.code == 503
