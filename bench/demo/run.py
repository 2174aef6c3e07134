"""`laneway demo`: simulated pools and the gateway on this machine, a mixed workload, a live table.

Everything comes from embedded defaults: two interactive engines (context capped at 8k,
short prompts only) and two batch engines (128k context, chunked prefill), one public model
name for both lanes, and the gateway in front. Chat sessions and a few long documents go
through the gateway while a table of per-lane TTFT/TBT percentiles and per-pool request
counts refreshes, and a verdict against the SLOs ends it; `--serve` then keeps it all running
for curl or an OpenAI client (`--serve --duration 0`: at once, without the workload).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from laneway.api import Lane, SLOSpec
from laneway.bench.demo.vllm import (
    VLLM_POOLS,
    start_vllm_engines,
    stopping,
    vllm_documents,
    vllm_workload,
)
from laneway.bench.harness.live_cluster import start_cluster, start_gateway
from laneway.bench.harness.loadgen import LoadGenerator
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.summary import LaneSummary, summarize
from laneway.bench.harness.vllm_server import installed as vllm_installed
from laneway.bench.harness.workload import EXPECTED_LANE, LongRequest, Workload
from laneway.errors import UsageError, cannot_listen
from laneway.simulator.profiles import DEFAULT_PROFILE, PROFILES
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import PUBLIC_MODEL, SimPool
from laneway.tables import format_table
from laneway.tokens import HuggingFaceTokenizer, Tokenizer

DEMO_POOLS = (
    # Long prompts never reach this lane, so whole-prompt prefill is short here.
    SimPool(
        name="chat",
        lane=Lane.INTERACTIVE,
        max_prompt_tokens=4096,
        max_context_tokens=8192,
        replicas=2,
        engine=SchedulerConfig(kind="full", max_context=8192),
    ),
    SimPool(
        name="documents",
        lane=Lane.BATCH,
        max_prompt_tokens=131072 - 1024,
        max_context_tokens=131072,
        replicas=2,
        engine=SchedulerConfig(kind="chunked", max_context=131072),
        min_prompt_tokens=4097,
    ),
)


@dataclass(frozen=True)
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    duration_s: float = 40.0  # model time during which chat sessions start turns; 0: none
    sessions: int = 16
    long_documents: int = 4
    time_scale: float = 1.0
    seed: int = 0
    serve: bool = False
    refresh_s: float = 1.0  # wall time between two live-table updates
    redis_url: str | None = None  # the gateway's shared state; None: in memory
    engine: str = "sim"  # "vllm": real vLLM servers of a tiny model (laneway.bench.demo.vllm)


def check_options(options: DemoOptions) -> None:
    """UsageError naming the flag when the options cannot work."""
    if not 0 <= options.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {options.port}")
    if options.duration_s < 0:
        raise UsageError(f"--duration must be 0 seconds or more, got {options.duration_s:g}")
    if options.duration_s == 0 and not options.serve:
        raise UsageError("--duration 0 sends no workload: add --serve to only serve")
    if options.sessions < 0 or options.long_documents < 0:
        raise UsageError("--sessions and --long-documents must be 0 or more")
    if options.sessions == 0 and options.long_documents == 0 and options.duration_s > 0:
        raise UsageError("nothing to send: give --sessions or --long-documents above 0")
    if options.time_scale <= 0:
        raise UsageError(f"--time-scale must be above 0, got {options.time_scale:g}")
    if options.engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, got {options.engine!r}")
    if options.engine == "vllm" and options.time_scale != 1:
        raise UsageError("--time-scale is for simulated engines: real vLLM runs in real time")


ENGINES = ("sim", "vllm")


def demo_workload(options: DemoOptions) -> Workload:
    """Chat sessions for the whole duration; long documents spread over its first half."""
    if options.engine == "vllm":
        return vllm_workload(
            options.sessions, options.long_documents, options.duration_s, options.seed
        )
    count = options.long_documents
    sizes = (32_768, 49_152, 65_536, 98_304)
    long_requests = tuple(
        LongRequest(
            at_s=options.duration_s * (index + 1) / (2 * count + 2),
            prompt_tokens=sizes[index % len(sizes)],
            output_tokens=256,
        )
        for index in range(count)
    )
    return Workload(
        model=PUBLIC_MODEL,
        sessions=options.sessions,
        prompt_tokens=(200, 1500),
        output_tokens=(50, 250),
        think_s=(1.0, 3.0),
        ramp_s=min(2.0, options.duration_s / 4),
        duration_s=options.duration_s,
        long_requests=long_requests,
        drain_s=120.0,
        seed=options.seed,
    )


def config_documents(endpoints: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """The gateway's config: one InferencePool per demo pool, with its engines' URLs."""
    return [pool.document(endpoints[pool.name], namespace="demo") for pool in DEMO_POOLS]


# -- the table (pure) ---------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def render_table(
    summaries: Sequence[LaneSummary], in_flight: Mapping[str, int], heading: str
) -> list[str]:
    """Per-lane latency percentiles and where the requests went, one row per lane."""
    header = ("lane", "done", "failed", "running", "TTFT p50", "TTFT p99", "TBT p50", "TBT p99")
    rows = [
        (
            summary.lane,
            str(summary.requests),
            str(summary.failed),
            str(in_flight.get(summary.lane, 0)),
            _ms(summary.ttft.p50 if summary.ttft else None),
            _ms(summary.ttft.p99 if summary.ttft else None),
            _ms(summary.tbt.p50 if summary.tbt else None),
            _ms(summary.tbt.p99 if summary.tbt else None),
        )
        for summary in summaries
    ]
    # A lane whose first requests are still running has no summary yet, but shows up.
    done_lanes = {summary.lane for summary in summaries}
    rows += [
        (lane, "0", "0", str(running), "-", "-", "-", "-")
        for lane, running in in_flight.items()
        if running and lane not in done_lanes
    ]
    lines = [heading, *format_table(header, rows)]
    pools = [f"{pool} {count}" for s in summaries for pool, count in s.pools]
    lines.append("requests per pool: " + (", ".join(pools) if pools else "-"))
    return lines


def slo_verdict(summaries: Sequence[LaneSummary], slo: SLOSpec) -> str:
    """One line: each lane's P99s against the SLO, and whether every request succeeded.

    TBT is held in every lane (chunked prefill keeps a long prefill from stalling anyone's
    decode); TTFT only in the interactive lane, since a long document's first token waits
    for the prefill of its whole prompt, seconds by design.
    """
    ttft_s, tbt_s = slo.ttft_millis / 1000, slo.tbt_millis / 1000
    parts, missed = [], False
    for summary in summaries:
        checks = []
        if summary.lane == Lane.INTERACTIVE.value and summary.ttft is not None:
            checks.append(("TTFT", summary.ttft.p99, ttft_s))
        if summary.tbt is not None:
            checks.append(("TBT", summary.tbt.p99, tbt_s))
        words = []
        for name, value, target in checks:
            held = value <= target
            missed = missed or not held
            words.append(f"{name} p99 {_ms(value)} {'<=' if held else '>'} {_ms(target)}")
        if summary.failed:
            missed = True
            words.append(f"{summary.failed} failed")
        parts.append(f"{summary.lane} " + (", ".join(words) or "no tokens"))
    if not summaries:
        return "verdict: no requests finished"
    return f"verdict: SLOs {'MISSED' if missed else 'met'}: " + "; ".join(parts)


def screen_rows(lines: Sequence[str], columns: int) -> int:
    """Terminal rows `lines` fill once a terminal `columns` wide wraps each of them."""
    return sum(max(1, -(-len(line) // max(columns, 1))) for line in lines)


def in_flight_by_lane(generator: LoadGenerator) -> dict[str, int]:
    return {
        "interactive": generator.in_flight["interactive"],
        "batch": generator.in_flight["long"],
    }


# -- the shell ------------------------------------------------------------------------------


class LiveView:
    """Redraws the table in place on a terminal it fits; elsewhere appends it now and then.

    In place means: up to the first row drawn last time, then clear to the end of the screen.
    The rows are counted after the terminal wraps long lines, at its width now, so a narrow
    terminal leaves no old frames behind; a frame taller than the terminal cannot be reached
    from its last row, so it is appended instead, as to a file or a pipe.
    """

    def __init__(self, stream: TextIO, refresh_s: float, plain_every: int = 5) -> None:
        self._stream = stream
        self._refresh_s = refresh_s
        self._tty = stream.isatty()
        self._plain_every = plain_every
        self._frame: list[str] = []  # the lines drawn in place last, still on screen

    async def run(self, generator: LoadGenerator, duration_s: float) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(self._refresh_s)
            ticks += 1
            self.draw(generator, duration_s, plain=ticks % self._plain_every == 0)

    def draw(self, generator: LoadGenerator, duration_s: float, plain: bool) -> None:
        elapsed = generator.elapsed_s()
        phase = "sending" if elapsed < duration_s else "finishing"
        heading = f"[{elapsed:5.1f} s / {duration_s:g} s, {phase}]"
        lines = render_table(summarize(generator.records), in_flight_by_lane(generator), heading)
        self.show(lines, plain)

    def show(self, lines: list[str], plain: bool) -> None:
        """In place where it fits; else appended, when `plain` (every few refreshes)."""
        size = self._terminal_size()
        if size is not None and screen_rows(lines, size.columns) < size.lines:
            self._erase(size.columns)
            self._frame = lines
        elif plain:
            self._frame = []
        else:
            return
        self._stream.write("\n".join(lines) + "\n")
        self._stream.flush()

    def clear(self) -> None:
        """Take the last in-place frame off the screen (the final report follows)."""
        size = self._terminal_size()
        if size is not None:
            self._erase(size.columns)
            self._stream.flush()

    def _erase(self, columns: int) -> None:
        if self._frame:
            self._stream.write(f"\x1b[{screen_rows(self._frame, columns)}F\x1b[J")
            self._frame = []

    def _terminal_size(self) -> os.terminal_size | None:
        if not self._tty:
            return None
        try:
            return os.get_terminal_size(self._stream.fileno())
        except (OSError, ValueError):
            return None


def check_port_free(host: str, port: int) -> None:
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise cannot_listen(host, port, error) from None


def say(message: str) -> None:
    print(f"laneway demo: {message}", file=sys.stderr, flush=True)


async def start_everything(
    children: Children, options: DemoOptions, config_dir: Path
) -> ChildProcess:
    """Start every engine (in parallel), then the gateway configured with their URLs."""
    engines = sum(pool.replicas for pool in DEMO_POOLS)
    say(f"starting {engines} simulated engines ({DEFAULT_PROFILE}) and the gateway ...")
    cluster = await start_cluster(
        children,
        DEMO_POOLS,
        PROFILES[DEFAULT_PROFILE],
        options.time_scale,
        config_documents,
        [
            *("--host", options.host, "--port", str(options.port)),
            *("--redis-url", options.redis_url or ""),
        ],
        config_dir,
    )
    gateway, endpoints = cluster.gateway, cluster.endpoints
    for pool in DEMO_POOLS:
        say(
            f"pool {pool.name} ({pool.lane.value}): prompts {pool.min_prompt_tokens:,}-"
            f"{pool.max_prompt_tokens:,} tokens, context cap {pool.max_context_tokens:,}, "
            f"{pool.engine.kind} prefill: {', '.join(endpoints[pool.name])}"
        )
    say(f"gateway: {gateway.url}")
    return gateway


async def start_on_vllm(
    children: Children,
    options: DemoOptions,
    config_dir: Path,
    servers: list[subprocess.Popen[bytes]],
) -> tuple[ChildProcess, Tokenizer]:
    """One `vllm serve` per demo pool (each into `servers`, for the caller to stop), then the
    gateway configured with them; and the tokenizer prompts are made with (the model's)."""
    say(
        f"starting {len(VLLM_POOLS)} vLLM servers of a tiny model (random weights; minutes "
        f"on a small machine, logs in {config_dir}) and the gateway ..."
    )
    engines = await start_vllm_engines(config_dir, servers)
    gateway = await start_gateway(
        children,
        vllm_documents(engines),
        [
            *("--host", options.host, "--port", str(options.port)),
            *("--redis-url", options.redis_url or ""),
        ],
        config_dir,
    )
    for pool in VLLM_POOLS:
        say(
            f"pool {pool.name} ({pool.lane.value}): prompts {pool.min_prompt_tokens:,}-"
            f"{pool.max_prompt_tokens:,} tokens, context cap {pool.max_context_tokens:,}, "
            f"vLLM {pool.engine.kind} prefill: {', '.join(engines.endpoints[pool.name])}"
        )
    say(f"gateway: {gateway.url}")
    files = engines.model.files
    return gateway, HuggingFaceTokenizer(files.tokenizer, files.config)


async def drive(
    options: DemoOptions,
    gateway_url: str,
    children: Children,
    tokenizer: Tokenizer | None = None,
) -> LoadGenerator:
    workload = demo_workload(options)
    say(
        f"sending {workload.sessions} chat sessions for {workload.duration_s:g} s and "
        f"{workload.long_request_count} long document(s)"
        + (
            f" of {', '.join(f'{r.prompt_tokens:,}' for r in workload.long_requests)} tokens"
            if workload.long_requests
            else ""
        )
        + (f", {options.time_scale:g}x faster than real time" if options.time_scale != 1 else "")
    )
    generator = LoadGenerator(
        workload, gateway_url, time_scale=options.time_scale, tokenizer=tokenizer
    )
    view = LiveView(sys.stderr, options.refresh_s)
    drawing = asyncio.create_task(view.run(generator, workload.duration_s))
    try:
        await children.watch(generator.run())
    finally:
        drawing.cancel()
        await asyncio.gather(drawing, return_exceptions=True)
    if sys.stdout.isatty():
        view.clear()  # the final report shows the same table on the same terminal
    return generator


def final_report(generator: LoadGenerator) -> list[str]:
    records = generator.records
    summaries = summarize(records)
    heading = f"laneway demo: {len(records)} of {generator.issued} requests accounted for"
    lines = render_table(summaries, {}, heading)
    for summary in summaries:
        if summary.e2e is not None:
            lines.append(
                f"{summary.lane}: end to end p50 {_ms(summary.e2e.p50)}, "
                f"p99 {_ms(summary.e2e.p99)}; {summary.output_tokens:,} tokens streamed"
            )
        lines.extend(f"{summary.lane}: {count} x {message}" for message, count in summary.errors)
    misrouted = sum(1 for r in records if r.lane is not None and r.lane != EXPECTED_LANE[r.kind])
    lines.append(f"requests outside their lane: {misrouted}")
    lines.append(slo_verdict(summaries, SLOSpec()))
    return lines


def serve_instructions(gateway_url: str) -> list[str]:
    chat = (
        '{"model": "' + PUBLIC_MODEL + '", "messages": [{"role": "user", "content": "Hello!"}], '
        '"max_tokens": 32, "stream": true}'
    )
    return [
        f"serving on {gateway_url} until Ctrl-C; try:",
        f"  curl -N {gateway_url}/v1/chat/completions -H 'content-type: application/json' "
        f"-d '{chat}'",
        f"  curl -s {gateway_url}/v1/models",
        f"  curl -s {gateway_url}/metrics | grep laneway_",
        '  python -c "from openai import OpenAI; '
        f"c = OpenAI(base_url='{gateway_url}/v1', api_key='unused'); "
        f"r = c.chat.completions.create(model='{PUBLIC_MODEL}', "
        "messages=[{'role': 'user', 'content': 'Hello!'}], max_tokens=16); "
        'print(r.choices[0].message.content)"',
    ]


async def run_demo(options: DemoOptions) -> int:
    check_port_free(options.host, options.port)
    if options.engine == "vllm" and (reason := vllm_installed()) is not None:
        raise UsageError(f"--engine vllm: {reason}")
    servers: list[subprocess.Popen[bytes]] = []  # vLLM's, stopped last
    with tempfile.TemporaryDirectory(prefix="laneway-demo-") as config_dir, stopping(servers):
        async with Children() as children:
            tokenizer = None
            if options.engine == "vllm":
                gateway, tokenizer = await start_on_vllm(
                    children, options, Path(config_dir), servers
                )
            else:
                gateway = await start_everything(children, options, Path(config_dir))
            if options.duration_s > 0:
                generator = await drive(options, gateway.url, children, tokenizer)
                print("\n".join(final_report(generator)), flush=True)
            if options.serve:
                say("\n".join(serve_instructions(gateway.url)))
                await children.watch(asyncio.Event().wait())
            say("stopping the gateway and the engines")
    return 0
