"""Files have a per-tenant quota of count and bytes, and expire; ids are checked first.

A real `laneway gateway` with a tenants file and a real Redis, over loopback.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.launch import start_gateway
from support.pools import pool_doc

from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import LocalRedis

TENANTS = {
    "tenants": [
        {"name": "small", "apiKeys": ["sk-small"], "maxFiles": 2},
        {"name": "tiny", "apiKeys": ["sk-tiny"], "maxFileBytes": 300},
        {"name": "other", "apiKeys": ["sk-other"]},
    ]
}
LINE = json.dumps(
    {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
)


def start_quota_gateway(children: Children, redis: LocalRedis, tmp_path: Path, *extra: str) -> str:
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))
    # A pool is required; nothing here is routed to it (port 9 is discard).
    pool = pool_doc("solo", "interactive", "m", ["http://127.0.0.1:9"], routing={"models": ["m"]})
    flags = ("--redis-url", redis.url, "--tenants", str(tmp_path / "tenants.yaml"), *extra)
    return start_gateway(children, tmp_path / "gateway.yaml", [pool], *flags).url


def call(
    url: str, key: str, method: str = "GET", body: bytes | None = None, boundary: str = ""
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    if boundary:
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    request = urllib.request.Request(url, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def upload(url: str, key: str, lines: int = 1) -> tuple[int, Any]:
    content = "\n".join([LINE] * lines)
    body = (
        '--b0\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        '--b0\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
        f"{content}\r\n--b0--\r\n"
    ).encode()
    return call(f"{url}/v1/files", key, "POST", body, boundary="b0")


@pytest.fixture
def running() -> Iterator[tuple[Children, LocalRedis]]:
    with LocalRedis() as redis, Children() as children:
        yield children, redis


def test_a_tenant_keeps_at_most_its_files_and_bytes(
    running: tuple[Children, LocalRedis], tmp_path: Path
) -> None:
    url = start_quota_gateway(*running, tmp_path)
    first = upload(url, "sk-small")
    assert first[0] == 200
    assert first[1]["expires_at"] == first[1]["created_at"] + 30 * 24 * 3600
    assert upload(url, "sk-small")[0] == 200
    status, refused = upload(url, "sk-small")
    assert status == 429
    assert refused["error"]["code"] == "file_quota_exceeded"
    assert "2 files of 2" in refused["error"]["message"]
    # Another tenant's storage is its own.
    assert upload(url, "sk-other")[0] == 200
    # Deleting a file makes room.
    assert call(f"{url}/v1/files/{first[1]['id']}", "sk-small", "DELETE")[0] == 200
    assert upload(url, "sk-small")[0] == 200

    assert upload(url, "sk-tiny", lines=1)[0] == 200  # ~150 bytes of 300
    status, refused = upload(url, "sk-tiny", lines=2)
    assert status == 429
    assert "bytes, over 300" in refused["error"]["message"]


def test_files_expire_and_give_their_quota_back(
    running: tuple[Children, LocalRedis], tmp_path: Path
) -> None:
    url = start_quota_gateway(*running, tmp_path, "--file-ttl", "1")
    made = [upload(url, "sk-small")[1]["id"] for _ in range(2)]
    deadline = time.monotonic() + 120
    # Redis drops each file when its time is up; then its quota is free again.
    while call(f"{url}/v1/files/{made[0]}", "sk-small")[0] != 404:
        assert time.monotonic() < deadline, "the file never expired"
        time.sleep(0.2)
    assert upload(url, "sk-small")[0] == 200
    listed = call(f"{url}/v1/files", "sk-small")[1]
    assert not {f["id"] for f in listed["data"]} & set(made)
