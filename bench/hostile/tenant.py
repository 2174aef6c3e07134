"""The tenant phases of `laneway bench hostile` (issue 29): a hostile tenant against the
Files and Batches APIs, on a gateway with Redis and a tenants file.

- A batch of `lines` requests (50,000, OpenAI's cap, by default): `/healthz` is probed from
  the create until the batch completes; the create's latency, the completion time and the
  resident memory of the gateway and of Redis before, at their peaks and after are
  reported.
- Slow bodies: uploads and creates sent a byte at a time, which must get 408 within the
  route's deadline.
- The small ones: a garbage `Content-Encoding` on each route, `?limit=²`, a part with
  `charset=bogus`, `/laneway/demand` without a key, and each engine-control body field
  (fields.py). Each must be a 4xx.
- Another tenant's `"priority": -1000` on a priority-scheduled engine (fields.py): it must
  not jump the victim's queued request.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from laneway.bench.harness.summary import Distribution
from laneway.bench.hostile.fields import (
    PriorityRun,
    engine_control_cases,
    priority_case,
    render_priority,
)

KEY = "sk-bench"
VICTIM_KEY = "sk-victim"
TENANTS = {
    "tenants": [{"name": "bench", "apiKeys": [KEY]}, {"name": "victim", "apiKeys": [VICTIM_KEY]}]
}
AUTH = {"Authorization": f"Bearer {KEY}"}
VICTIM_AUTH = {"Authorization": f"Bearer {VICTIM_KEY}"}
BODY_DEADLINE_MS = 2000  # the bench gateway's body and upload deadlines
SLOW_BODIES = 10  # as many as the issue held open


@dataclass(frozen=True)
class BatchRun:
    lines: int
    healthz_ms: Distribution  # from the create until the batch finished
    healthz_create_ms: Distribution  # while the create was answered
    healthz_run_ms: Distribution  # from its answer until the batch finished
    create_ms: float
    create_status: int
    status: str  # the batch's final status (or the create's error code)
    completed: int
    failed: int
    finish_s: float  # from the create until the batch finished
    slowest_probe_at_s: float  # when the slowest probe was sent, from the create
    rss_mb_before: float
    rss_mb_peak: float
    rss_mb_after: float
    redis_rss_mb_before: float
    redis_rss_mb_peak: float
    redis_rss_mb_after: float


@dataclass(frozen=True)
class TenantReport:
    batch: BatchRun
    slow_bodies: dict[str, int]  # answer status -> count
    slow_answer_s: float  # the slowest 408 after the head was sent
    small_ones: dict[str, str]  # case -> answer status
    priority: PriorityRun


def write_tenants(directory: Path) -> Path:
    path = directory / "tenants.yaml"
    path.write_text(yaml.safe_dump(TENANTS))
    return path


def batch_input(lines: int, model: str) -> bytes:
    return "\n".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "messages": [{"role": "user", "content": f"item {i}"}],
                    "max_tokens": 1,
                },
            }
        )
        for i in range(lines)
    ).encode()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def _probe_until(
    session: aiohttp.ClientSession, url: str, done: asyncio.Event, pids: tuple[int, int]
) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    """(when sent, ms) of each probe until `done`, and the peak RSS of each of `pids`
    meanwhile."""
    latencies: list[tuple[float, float]] = []
    peaks = tuple(rss_mb(pid) for pid in pids)
    while not done.is_set():
        begun = time.monotonic()
        async with session.get(f"{url}/healthz") as response:
            await response.read()
        latencies.append((begun, (time.monotonic() - begun) * 1000))
        peaks = tuple(max(peak, rss_mb(pid)) for peak, pid in zip(peaks, pids, strict=True))
        await asyncio.sleep(0.005)
    gateway, redis = peaks
    return latencies, (gateway, redis)


async def run_batch(
    session: aiohttp.ClientSession, url: str, pids: tuple[int, int], lines: int, model: str
) -> BatchRun:
    """`pids`: the gateway's and its Redis's."""
    pid, redis_pid = pids
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(batch_input(lines, model)), filename="input.jsonl")
    async with session.post(f"{url}/v1/files", data=form, headers=AUTH) as response:
        uploaded = await response.json()
    await asyncio.sleep(1.0)  # the upload's own buffers settle before the baseline
    before, redis_before = rss_mb(pid), rss_mb(redis_pid)
    done = asyncio.Event()
    probing = asyncio.create_task(_probe_until(session, url, done, pids))
    begun = time.monotonic()
    create = {
        "input_file_id": uploaded["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    async with session.post(f"{url}/v1/batches", json=create, headers=AUTH) as response:
        create_status = response.status
        batch = await response.json()
    answered = time.monotonic()
    create_ms = (answered - begun) * 1000
    while create_status == 200 and batch["status"] not in ("completed", "failed", "expired"):
        await asyncio.sleep(0.5)
        async with session.get(f"{url}/v1/batches/{batch['id']}", headers=AUTH) as response:
            batch = await response.json()
    finish_s = time.monotonic() - begun
    done.set()
    latencies, (peak, redis_peak) = await probing
    healthz, creating, running = (
        _distribution([ms for sent, ms in latencies if keep(sent)])
        for keep in (lambda _: True, lambda sent: sent < answered, lambda sent: sent >= answered)
    )
    counts = batch.get("request_counts") or {}
    slowest_sent, _ = max(latencies, key=lambda probe: probe[1])
    return BatchRun(
        lines=lines,
        healthz_ms=healthz,
        healthz_create_ms=creating,
        healthz_run_ms=running,
        create_ms=create_ms,
        create_status=create_status,
        status=batch.get("status") or batch["error"]["code"],
        completed=int(counts.get("completed", 0)),
        failed=int(counts.get("failed", 0)),
        finish_s=finish_s,
        slowest_probe_at_s=slowest_sent - begun,
        rss_mb_before=before,
        rss_mb_peak=peak,
        rss_mb_after=rss_mb(pid),
        redis_rss_mb_before=redis_before,
        redis_rss_mb_peak=redis_peak,
        redis_rss_mb_after=rss_mb(redis_pid),
    )


def _distribution(values: list[float]) -> Distribution:
    # A create answered before the first probe returned leaves that part with none.
    return Distribution.of(values) or Distribution(count=0, p50=0.0, p99=0.0, max=0.0)


async def _slow_body(port: int, path: str) -> tuple[str, float]:
    """A body sent a byte every 0.5 s; its answer's status and how long it took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    kind = "multipart/form-data; boundary=B" if path == "/v1/files" else "application/json"
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: {kind}\r\nContent-Length: 1000000\r\n\r\n".encode()
    )
    begun = time.monotonic()

    async def trickle() -> None:
        while True:
            writer.write(b"-")
            await writer.drain()
            await asyncio.sleep(0.5)

    sending = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(60):
            head = await reader.readline()
    except TimeoutError:
        head = b"HTTP/1.1 000 none"
    finally:
        sending.cancel()
        writer.close()
    return head.split(b" ")[1].decode(), time.monotonic() - begun


async def slow_bodies(port: int) -> tuple[dict[str, int], float]:
    paths = ["/v1/files", "/v1/batches"] * (SLOW_BODIES // 2)
    answers = await asyncio.gather(*(_slow_body(port, path) for path in paths))
    statuses: dict[str, int] = {}
    for status, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    return statuses, max(took for _, took in answers)


async def _raw(port: int, head: str, body: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    answer = await reader.readline()
    writer.close()
    return answer.split(b" ")[1].decode()


async def small_ones(
    session: aiohttp.ClientSession, url: str, port: int, model: str
) -> dict[str, str]:
    found = await engine_control_cases(session, url, AUTH, model)
    for path in ("/v1/files", "/v1/batches"):
        async with session.get(f"{url}{path}?limit=²", headers=AUTH) as response:
            found[f"GET {path}?limit=²"] = str(response.status)
    part = (
        b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n'
        b"Content-Type: text/plain; charset=bogus\r\n\r\nbatch\r\n--B--\r\n"
    )
    found["part with charset=bogus"] = await _raw(
        port,
        "POST /v1/files HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer sk-bench\r\n"
        "Content-Type: multipart/form-data; boundary=B\r\n",
        part,
    )
    for method, path in (
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/files"),
        ("GET", "/healthz"),
    ):
        found[f"Content-Encoding: garbage, {method} {path}"] = await _raw(
            port,
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Encoding: garbage\r\n",
            b"{}",
        )
    async with session.get(f"{url}/laneway/demand") as response:
        found["/laneway/demand without a key"] = str(response.status)
    return found


async def measure_tenant(
    url: str, pids: tuple[int, int], lines: int, model: str, ordered_engine: str
) -> TenantReport:
    """`pids`: the gateway's and its Redis's; `ordered_engine`: the URL of the
    priority-scheduled pool's one-seat engine."""
    port = int(url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        small = await small_ones(session, url, port, model)
        priority = await priority_case(session, url, ordered_engine, VICTIM_AUTH, AUTH)
        statuses, slowest = await slow_bodies(port)
        batch = await run_batch(session, url, pids, lines, model)
    return TenantReport(
        batch=batch,
        slow_bodies=statuses,
        slow_answer_s=slowest,
        small_ones=small,
        priority=priority,
    )


def render_tenant(report: TenantReport) -> list[str]:
    b = report.batch

    def probes(d: Distribution) -> str:
        return f"{d.count} probes, p50 {d.p50:.1f} ms, p99 {d.p99:.1f} ms, max {d.max:.1f} ms"

    return [
        "",
        f"a hostile tenant (Redis, tenants file; body and upload deadlines {BODY_DEADLINE_MS} ms)",
        f"{b.lines}-line batch: create {b.create_status} in {b.create_ms:.0f} ms, "
        f"{b.status} after {b.finish_s:.1f} s ({b.completed} completed, {b.failed} failed)",
        f"  /healthz meanwhile: {probes(b.healthz_ms)}",
        f"    while creating: {probes(b.healthz_create_ms)}",
        f"    while running: {probes(b.healthz_run_ms)}",
        f"    the slowest sent {b.slowest_probe_at_s:.1f} s after the create",
        f"  gateway RSS: {b.rss_mb_before:.0f} MB before, {b.rss_mb_peak:.0f} MB at peak "
        f"(+{b.rss_mb_peak - b.rss_mb_before:.0f}), {b.rss_mb_after:.0f} MB after",
        f"  Redis RSS: {b.redis_rss_mb_before:.0f} MB before, {b.redis_rss_mb_peak:.0f} MB at "
        f"peak (+{b.redis_rss_mb_peak - b.redis_rss_mb_before:.0f}), "
        f"{b.redis_rss_mb_after:.0f} MB after",
        f"{SLOW_BODIES} bodies a byte every 0.5 s: "
        + ", ".join(f"{s}: {n}" for s, n in sorted(report.slow_bodies.items()))
        + f", the slowest answered after {report.slow_answer_s:.1f} s",
        *(f"{case}: {status}" for case, status in report.small_ones.items()),
        render_priority(report.priority),
    ]
