"""Hostile tenants against Files and Batches, and every route's body: each case answered
in OpenAI's shape, never a 5xx, a traceback or a body held open.

An in-process gateway (its real app, on loopback) with a tenants file, a `laneway sim`
engine and a real Redis.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from redis.asyncio import Redis
from support.inproc import Served, Servers
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.redis_server import LocalRedis

KEY = {"Authorization": "Bearer sk-a"}
TENANTS = {
    "tenants": [
        {"name": "a", "apiKeys": ["sk-a"]},
        # Room for its input file and a few results, not for a whole batch's output.
        {"name": "tight", "apiKeys": ["sk-tight"], "maxFileBytes": 8_000},
    ]
}
ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/files"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/models"),
    ("GET", "/v1/files"),
    ("GET", "/healthz"),
]


@dataclass
class Gateway:
    served: Served
    redis: Redis
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.served.url

    async def call(
        self, method: str, path: str, key: str = "sk-a", **kwargs: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}", **kwargs.pop("headers", {})}
        async with self.session.request(
            method, self.url + path, headers=headers, **kwargs
        ) as response:
            return response.status, await response.json(content_type=None)

    async def upload(self, lines: list[str], key: str = "sk-a") -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", io.BytesIO("\n".join(lines).encode()), filename="in.jsonl")
        status, body = await self.call("POST", "/v1/files", key, data=form)
        assert status == 200, body
        return str(body["id"])


def request_line(custom_id: str, content: str = "hi") -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "llama",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 4,
            },
        }
    )


@pytest.fixture
async def gateway(tmp_path: Path, redis_server: LocalRedis) -> AsyncIterator[Gateway]:
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))
    servers = Servers()
    engine = await servers.sim("llama-small", "--time-scale", "1000")
    pool = pool_doc(
        "solo", "interactive", "llama-small", [engine.url], routing={"models": ["llama"]}
    )
    clients = {"bodyTimeoutMillis": 500, "uploadTimeoutMillis": 800}
    served = await servers.gateway(
        tmp_path / "gateway.yaml",
        [pool, gateway_doc(clients=clients)],
        *("--redis-url", redis_server.url, "--tenants", str(tmp_path / "tenants.yaml")),
    )
    redis = Redis.from_url(redis_server.url)
    async with aiohttp.ClientSession() as session:
        yield Gateway(served, redis, session)
    await redis.aclose()
    await servers.close()


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def raw_request(gateway: Gateway, head: str, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.served.port)
    try:
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_limit_in_other_digits_is_a_400(gateway: Gateway) -> None:
    for path in ("/v1/files", "/v1/batches"):
        status, body = await gateway.call("GET", f"{path}?limit=²")
        assert status == 400, body
        assert body["error"]["param"] == "limit"


async def test_a_part_in_an_unknown_charset_is_a_400(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    body = (
        b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n'
        b"Content-Type: text/plain; charset=bogus\r\n\r\nbatch\r\n"
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        b"{}\r\n--B--\r\n"
    )
    headers = {"Content-Type": "multipart/form-data; boundary=B"}
    status, answer = await gateway.call("POST", "/v1/files", data=body, headers=headers)
    assert status == 400, answer
    assert "bogus" in answer["error"]["message"]
    assert tracebacks(caplog) == []


@pytest.mark.parametrize("coding", ["garbage", "gzip, br", "identity;q=1", "gzip", "deflate"])
async def test_a_content_encoding_of_garbage_is_refused_on_every_route_without_a_traceback(
    gateway: Gateway, caplog: pytest.LogCaptureFixture, coding: str
) -> None:
    for method, path in ROUTES:
        body = b'{"model": "llama"}'  # not in the coding it claims
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"
            f"Content-Type: application/json\r\nContent-Encoding: {coding}\r\n"
            f"Content-Length: {len(body)}\r\n"
        )
        answer = await raw_request(gateway, head, body)
        status = int(answer.split(b" ", 2)[1])
        if coding in ("gzip", "deflate"):
            # A coding the gateway decodes: a body it cannot decode is a 400 where it is
            # read; routes that read no body answer as they would.
            assert status in (200, 400), answer[:300]
        else:
            assert status == 415, answer[:300]
            assert b"unsupported_content_encoding" in answer
    assert tracebacks(caplog) == []
    status, _ = await gateway.call("GET", "/healthz")
    assert status == 200


async def test_demand_needs_a_key_on_the_api_port(gateway: Gateway) -> None:
    async with gateway.session.get(gateway.url + "/laneway/demand") as response:
        assert response.status == 401
    status, body = await gateway.call("GET", "/laneway/demand")
    assert status == 200
    assert "default/solo" in body["pools"]


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches", "/v1/chat/completions"])
async def test_a_body_sent_a_byte_at_a_time_gets_a_408_and_the_connection_closes(
    gateway: Gateway, path: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.served.port)
    content_type = "multipart/form-data; boundary=B" if path == "/v1/files" else "application/json"
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: 100000\r\n\r\n".encode()
    )
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def trickle() -> None:
        for _ in range(100):
            writer.write(b"-")
            await writer.drain()
            await asyncio.sleep(0.1)

    sending = asyncio.create_task(trickle())
    answer = b""
    try:
        async with asyncio.timeout(8):
            while not answer.endswith(b"}}"):  # the whole JSON error, whatever comes after
                answer += await reader.read(4096)
    finally:
        sending.cancel()
        writer.close()
        await writer.wait_closed()
    took = loop.time() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b'"body_timeout"' in answer
    assert took < 4  # the route's deadline (0.5 s, uploads 0.8 s), not the trickle's 10 s


async def wait_status(gateway: Gateway, batch_id: str, key: str = "sk-a") -> dict[str, Any]:
    async with asyncio.timeout(120):
        while True:
            status, batch = await gateway.call("GET", f"/v1/batches/{batch_id}", key)
            assert status == 200, batch
            if batch["status"] in ("completed", "failed", "cancelled", "expired"):
                return dict(batch)
            await asyncio.sleep(0.1)


def create_body(file_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **extra,
    }


async def test_an_input_past_50000_lines_is_a_400_and_creates_nothing(gateway: Gateway) -> None:
    file_id = await gateway.upload([request_line(f"r{i}") for i in range(50_001)])
    status, body = await gateway.call("POST", "/v1/batches", json=create_body(file_id))
    assert status == 400, body
    assert body["error"]["code"] == "batch_too_large"
    assert "50001 lines" in body["error"]["message"]
    status, listed = await gateway.call("GET", "/v1/batches")
    assert listed["data"] == []


async def test_a_retried_create_finds_the_same_batch(gateway: Gateway) -> None:
    file_id = await gateway.upload([request_line(f"r{i}") for i in range(3)])
    first = await gateway.call("POST", "/v1/batches", json=create_body(file_id))
    again = await gateway.call("POST", "/v1/batches", json=create_body(file_id))
    assert first[0] == again[0] == 200
    assert first[1]["id"] == again[1]["id"]  # the same request: the same batch
    other = await gateway.call(
        "POST", "/v1/batches", json=create_body(file_id, metadata={"run": "2"})
    )
    assert other[1]["id"] != first[1]["id"]  # a different request is a new batch
    keyed = [
        await gateway.call(
            "POST",
            "/v1/batches",
            json=create_body(file_id, metadata={"run": str(n)}),
            headers={"Idempotency-Key": "job-7"},
        )
        for n in (3, 4)
    ]
    assert keyed[0][1]["id"] == keyed[1][1]["id"]  # the key decides, not the body
    _, listed = await gateway.call("GET", "/v1/batches")
    assert len(listed["data"]) == 3
    for batch in listed["data"]:
        assert (await wait_status(gateway, batch["id"]))["status"] == "completed"


async def test_batch_records_and_indexes_expire(gateway: Gateway) -> None:
    file_id = await gateway.upload([request_line("r0")])
    _, batch = await gateway.call("POST", "/v1/batches", json=create_body(file_id))
    done = await wait_status(gateway, batch["id"])
    assert done["status"] == "completed"
    record_ttl = await gateway.redis.ttl(f"laneway:batch:{batch['id']}")
    index_ttl = await gateway.redis.ttl("laneway:batches:a")
    assert 0 < record_ttl <= 30 * 24 * 3600  # a file TTL after it finished
    assert 0 < index_ttl <= 31 * 24 * 3600


async def test_outputs_past_the_file_quota_fail_their_items_instead_of_growing_the_store(
    gateway: Gateway,
) -> None:
    lines = [request_line(f"r{i}") for i in range(20)]
    file_id = await gateway.upload(lines, key="sk-tight")
    status, batch = await gateway.call("POST", "/v1/batches", "sk-tight", json=create_body(file_id))
    assert status == 200, batch
    done = await wait_status(gateway, batch["id"], "sk-tight")
    assert done["status"] == "completed"
    counts = done["request_counts"]
    assert counts["total"] == 20
    assert 0 < counts["completed"] < 20  # some fitted, the rest did not
    async with gateway.session.get(
        f"{gateway.url}/v1/files/{done['error_file_id']}/content",
        headers={"Authorization": "Bearer sk-tight"},
    ) as response:
        failed = [json.loads(line) for line in (await response.text()).splitlines()]
    assert len(failed) == counts["failed"]
    assert {line["error"]["code"] for line in failed} == {"file_quota_exceeded"}
    sizes = await gateway.redis.hgetall("laneway:filebytes:tight")
    stored = sum(int(v) for v in sizes.values())
    # Within the quota but for the short failure lines themselves.
    assert stored <= 8_000 + 400 * counts["failed"], sizes


async def test_a_retry_while_the_first_create_still_validates_gets_that_batch(
    gateway: Gateway,
) -> None:
    file_id = await gateway.upload([request_line(f"r{i}") for i in range(20_000)])
    first = asyncio.create_task(gateway.call("POST", "/v1/batches", json=create_body(file_id)))
    async with asyncio.timeout(60):
        while not (await gateway.call("GET", "/v1/batches"))[1]["data"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    status, retried = await gateway.call("POST", "/v1/batches", json=create_body(file_id))
    assert status == 200, retried
    assert retried["status"] == "validating"  # the first try is still at it
    status, created = await first
    assert status == 200, created
    assert created["id"] == retried["id"]
    assert created["status"] == "in_progress"
    _, listed = await gateway.call("GET", "/v1/batches")
    assert [b["id"] for b in listed["data"]] == [created["id"]]


async def test_a_file_of_several_pieces_is_streamed_back_whole(gateway: Gateway) -> None:
    lines = [request_line(f"r{i}", "x" * 300) for i in range(6_000)]  # about 2.6 MB
    file_id = await gateway.upload(lines)
    assert await gateway.redis.llen(f"laneway:file:{file_id}:pieces") == 3  # 1 MiB each
    async with gateway.session.get(
        f"{gateway.url}/v1/files/{file_id}/content", headers=KEY
    ) as response:
        assert response.status == 200
        content = await response.read()
        assert int(response.headers["Content-Length"]) == len(content)
    assert content == "\n".join(lines).encode()
    status, body = await gateway.call("GET", f"/v1/files/file-{'0' * 32}/content")
    assert status == 404, body  # still an OpenAI-shaped 404, not a cut-off stream
    assert body["error"]["type"] == "not_found_error"
