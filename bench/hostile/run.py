"""`laneway bench hostile`: /healthz latency while hostile request bodies arrive.

The shapes are the ones that once stalled the event loop for seconds (issue 14): a prompt
list of hundreds of thousands of short strings, a megabytes-long `role`, a hundred thousand
tiny messages, JSON nested past the recursion limit, an integer of 5,000 digits. A probe
asks /healthz every few milliseconds, first on a quiet gateway, then while senders post
those bodies back to back; the report is the probe's latency in each phase and the ratio.
Then a hostile tenant's cases (tenant.py) on a second gateway with Redis and a tenants file:
a 50,000-line batch, bodies sent a byte at a time, and the small ones of issue 29.
The goal of every case: no 5xx answer and no traceback in either gateway's output (both
counted and reported).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from laneway.api import API_VERSION
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.summary import Distribution
from laneway.bench.hostile.fields import ORDERED_MODEL
from laneway.bench.hostile.tenant import (
    BODY_DEADLINE_MS,
    TenantReport,
    measure_tenant,
    render_tenant,
    write_tenants,
)

MODEL = "llama"
# One seat, admitted by `priority` (lower first) as vLLM's --scheduling-policy priority.
ORDERED_SIM_ARGS = ["--host", "127.0.0.1", "--port", "0", "--model", "llama-small",
                    "--max-num-seqs", "1", "--scheduling-policy", "priority"]  # fmt: skip
# Each body stays under the gateway's default 4 MiB limit, as an attacker's would.
BODY_BUDGET = 3_900_000


def hostile_bodies() -> dict[str, bytes]:
    """Shape name -> a body of that shape, each just under the body limit (but the last:
    an engine-control field, which the gateway must refuse without forwarding)."""
    word_count = BODY_BUDGET // 5
    many_prompts = {"model": MODEL, "prompt": ["ab"] * word_count, "max_tokens": 1}
    long_role = {"model": MODEL, "messages": [{"role": "x" * BODY_BUDGET, "content": "hi"}]}
    tiny_messages = {"model": MODEL, "messages": [{"role": "user"}] * (BODY_BUDGET // 18)}
    # NixlConnector's fields (vLLM, distributed/kv_transfer/kv_connector/v1/nixl_connector.py):
    # prefill from another engine's KV blocks.
    remote = {"do_remote_prefill": True, "remote_engine_id": "other", "remote_block_ids": [1]}
    steer_kv = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "kv_transfer_params": {**remote, "remote_host": "10.0.0.1", "remote_port": 5600},
    }
    return {
        "780k-prompt list": json.dumps(many_prompts, separators=(",", ":")).encode(),
        "3.9 MB role": json.dumps(long_role).encode(),
        "216k messages": json.dumps(tiny_messages).encode(),
        "nested 1M deep": b"[" * (BODY_BUDGET // 2) + b"]" * (BODY_BUDGET // 2),
        "5000-digit int": b'{"model": "llama", "max_tokens": ' + b"9" * 5000 + b"}",
        "kv_transfer_params": json.dumps(steer_kv).encode(),
    }


@dataclass(frozen=True)
class Phase:
    name: str
    healthz_ms: Distribution
    hostile_sent: int
    statuses: dict[str, int]  # answer status of hostile bodies -> count


@dataclass(frozen=True)
class HostileReport:
    command: str
    machine: str
    phases: tuple[Phase, ...]
    tenant: TenantReport | None  # None with --batch-lines 0
    tracebacks: dict[str, int]  # gateway -> Python tracebacks in its stdout and stderr

    @property
    def server_errors(self) -> int:
        """5xx answers to any case (the goal is none)."""
        statuses = [
            int(s) for phase in self.phases for s, n in phase.statuses.items() for _ in range(n)
        ]
        if self.tenant is not None:
            t = self.tenant
            statuses += [int(s) for s, n in t.slow_bodies.items() for _ in range(n)]
            statuses += [int(s.split()[0]) for s in t.small_ones.values()]
            statuses += [*t.priority.statuses.values(), t.batch.create_status]
        return sum(1 for status in statuses if status >= 500)

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "server_errors": self.server_errors}


def render(report: HostileReport) -> list[str]:
    quiet = report.phases[0].healthz_ms
    lines = [
        f"laneway bench hostile: {report.command}",
        f"machine: {report.machine}",
        "",
        f"{'phase':<28}{'probes':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'p99/quiet':>11}  hostile answers",
    ]
    for phase in report.phases:
        d = phase.healthz_ms
        answers = ", ".join(f"{s}: {n}" for s, n in sorted(phase.statuses.items())) or "-"
        lines.append(
            f"{phase.name:<28}{d.count:>8}{d.p50:>9.1f}{d.p99:>9.1f}{d.max:>9.1f}"
            f"{d.p99 / quiet.p99 if quiet.p99 else 0:>10.1f}x  {answers}"
        )
    if report.tenant is not None:
        lines += render_tenant(report.tenant)
    tracebacks = ", ".join(f"{name} {count}" for name, count in report.tracebacks.items())
    lines += ["", f"5xx answers: {report.server_errors}; tracebacks logged: {tracebacks}"]
    return lines


async def _probe(
    session: aiohttp.ClientSession, url: str, until: float, clock: Callable[[], float]
) -> list[float]:
    latencies = []
    while clock() < until:
        begun = clock()
        async with session.get(f"{url}/healthz") as response:
            await response.read()
        latencies.append((clock() - begun) * 1000)
        await asyncio.sleep(0.005)
    return latencies


def send_phase(url: str, shapes: list[str], seconds: float, senders: int) -> dict[str, int]:
    """Post the named shapes for `seconds` from `senders` tasks; answer status -> count.

    Runs in a process of its own, so that the probe's latency is the gateway's and not
    that of a client loop busy writing megabytes.
    """

    async def run() -> dict[str, int]:
        bodies = [hostile_bodies()[shape] for shape in shapes]
        until = time.monotonic() + seconds
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            sent = await asyncio.gather(
                *(_send(session, url, bodies, until) for _ in range(senders))
            )
        statuses: dict[str, int] = {}
        for counts in sent:
            for status, count in counts.items():
                statuses[status] = statuses.get(status, 0) + count
        return statuses

    return asyncio.run(run())


async def _send(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], until: float
) -> dict[str, int]:
    statuses: dict[str, int] = {}
    index = 0
    while time.monotonic() < until:  # a sender stops after the phase; its last body finishes
        body = bodies[index % len(bodies)]
        index += 1
        path = "/v1/completions" if b'"prompt"' in body[:40] else "/v1/chat/completions"
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{url}{path}", data=body, headers=headers) as response:
            await response.read()
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
    return statuses


async def measure(url: str, seconds: float, senders: int) -> tuple[Phase, ...]:
    clock = time.monotonic
    shapes = list(hostile_bodies())
    phases = []
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as sender:
        await loop.run_in_executor(sender, hostile_bodies)  # imports done before measuring
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            quiet = await _probe(session, url, clock() + seconds, clock)
            phases.append(
                Phase(name="quiet", healthz_ms=_distribution(quiet), hostile_sent=0, statuses={})
            )
            for name, chosen in [("all shapes", shapes), *((s, [s]) for s in shapes)]:
                sending = loop.run_in_executor(sender, send_phase, url, chosen, seconds, senders)
                probe = await _probe(session, url, clock() + seconds, clock)
                statuses = await sending
                phase = Phase(
                    name=f"{name} x{senders}",
                    healthz_ms=_distribution(probe),
                    hostile_sent=sum(statuses.values()),
                    statuses=statuses,
                )
                phases.append(phase)
    return tuple(phases)


def _distribution(values: list[float]) -> Distribution:
    distribution = Distribution.of(values)
    assert distribution is not None, "the probe ran no request"
    return distribution


def pool_document(name: str, model: str, endpoint: str) -> dict[str, object]:
    return {
        "apiVersion": API_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "lane": "interactive",
            "model": "llama-small",
            "engine": {"kind": "simulator"},
            "routing": {"models": [model]},
            "limits": {"maxContextTokens": 8192},
        },
        "status": {"endpoints": [endpoint]},
    }


def config_documents(endpoint: str) -> list[dict[str, object]]:
    return [pool_document("solo", MODEL, endpoint)]


def tenant_documents(endpoint: str, ordered_endpoint: str) -> list[dict[str, object]]:
    """The solo pool, a priority-scheduled one (`ORDERED_MODEL`) and the body deadlines."""
    ordered = pool_document("ordered", ORDERED_MODEL, ordered_endpoint)
    spec = ordered["spec"]
    assert isinstance(spec, dict)
    spec["scheduling"] = {"policy": "priority"}
    deadlines = {"bodyTimeoutMillis": BODY_DEADLINE_MS, "uploadTimeoutMillis": BODY_DEADLINE_MS}
    gateway: dict[str, object] = {
        "apiVersion": API_VERSION,
        "kind": "GatewayConfig",
        "metadata": {"name": "hostile"},
        "spec": {"clients": deadlines},
    }
    return [*config_documents(endpoint), ordered, gateway]


async def run_bench(seconds: float, senders: int, batch_lines: int, command: str) -> HostileReport:
    from laneway.bench.harness.live_cluster import LOOPBACK_ANY_PORT, start_gateway
    from laneway.bench.harness.machine import machine_description
    from laneway.bench.harness.redis_server import LocalRedis

    tenant = None
    gateways: dict[str, ChildProcess] = {}
    with Children() as children:
        engine = await children.start_laneway_async(
            "sim", ["--host", "127.0.0.1", "--port", "0", "--model", "llama-small"]
        )
        gateway = await start_gateway(children, config_documents(engine.url))
        gateways["bodies gateway"] = gateway
        phases = await measure(gateway.url, seconds, senders)
        if batch_lines:
            ordered = await children.start_laneway_async("sim", ORDERED_SIM_ARGS, "ordered sim")
            with LocalRedis() as redis, tempfile.TemporaryDirectory() as directory:
                flags = ["--redis-url", redis.url, "--tenants", str(write_tenants(Path(directory)))]
                documents = tenant_documents(engine.url, ordered.url)
                shared = await start_gateway(children, documents, [*LOOPBACK_ANY_PORT, *flags])
                gateways["tenant gateway"] = shared
                tenant = await measure_tenant(
                    shared.url, (shared.pid, redis.pid), batch_lines, MODEL, ordered.url
                )
    # Counted once they have stopped: every line they printed has been read.
    return HostileReport(
        command=command,
        machine=machine_description(),
        phases=phases,
        tenant=tenant,
        tracebacks={name: child.tracebacks() for name, child in gateways.items()},
    )
