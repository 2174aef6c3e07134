"""`laneway bench gateway --against PEER,...`: laneway beside Rust routers in one run.

The same zero-service-time `laneway sim` engines behind every router, the same closed-loop
clients, every router pinned to the same one CPU (engines and clients on the others), one
router measured at a time. For each of a non-streaming and a streaming request it reports
requests/s, the latency each router adds over going straight to the engines (P50/P99), and
the CPU milliseconds the router process spent per request, with the ratio to laneway's.

The peers are Python packages with Rust cores: they are installed on demand into a virtual
environment of their own (`--peers-venv`), never as a dependency of laneway. One more peer,
`python-floor`, is laneway's own measuring stick (bench/gateway/floor_proxy.py): a proxy on the
gateway's event loop and HTTP stack (aiohttp's server and client) that does nothing but
forward, so the gap between it and laneway is laneway's own work, and the gap between it and
the Rust routers is what that stack costs.
And `laneway@DIR` is laneway as installed in DIR (`pip install --no-deps --target DIR` of
another checkout): the same bench, before and after a change, in one run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from laneway.bench.gateway import envoy_peers, floor_proxy
from laneway.bench.gateway.config import MODEL, engine_args, gateway_config
from laneway.bench.gateway.envoy_peers import ENVOY_PEERS, Together, envoy_version, start_envoy_peer
from laneway.bench.gateway.profile import Profile, Sampler, render_profiles, summarize
from laneway.bench.gateway.run import progress
from laneway.bench.harness.closed_loop import in_closed_loop
from laneway.bench.harness.live_cluster import start_gateway
from laneway.bench.harness.machine import machine_description, pin
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.stream import stream_request
from laneway.bench.harness.summary import Distribution
from laneway.errors import UsageError
from laneway.gateway.cli import event_loop_factory
from laneway.tables import format_table
from laneway.tokens import default_tokenizer

# The console script of each peer and the words before its flags; both take the same flags.
PEER_COMMANDS = {
    "sglang-router": ("sglang-router", "launch"),
    "vllm-router": ("vllm-router",),
}
FLOOR = "python-floor"  # bench/gateway/floor_proxy.py, run by this Python
BASELINE = "laneway@"  # laneway@DIR: laneway imported from DIR, e.g. an earlier commit's
PICKER_BASELINE = (
    f"{envoy_peers.ENVOY_LANEWAY}@"  # envoy+laneway@DIR: Envoy with DIR's `laneway epp`
)
DIRECT = "direct"  # the clients straight to the engines, round robin: the baseline
LANEWAY = "laneway"
# The routers --profile samples: the gateway, and the pickers behind Envoy (laneway's, and
# the floor's to hold it against).
PROFILED = (
    LANEWAY,
    envoy_peers.ENVOY_LANEWAY,
    envoy_peers.ENVOY_FLOOR,
    envoy_peers.ENVOY_FLOOR_THREADS,
)
# The pickers behind Envoy that the goal holds against the cheaper floor of each round.
FLOORS = tuple(envoy_peers.FLOOR_SERVERS)
READY_LINE = "peer router starting: "
PY_SPY = "py-spy"  # the sampling profiler of --profile, installed beside the peers
ROUNDS = 2  # per router and mode by default, the order reversed in every other one


@dataclass(frozen=True)
class Mode:
    name: str
    stream: bool
    output_tokens: int


MODES = (
    Mode(name="non-streaming", stream=False, output_tokens=16),
    Mode(name="streaming", stream=True, output_tokens=64),
)


@dataclass(frozen=True)
class AgainstOptions:
    peers: tuple[str, ...]
    venv: Path
    concurrency: int = 64
    requests: int = 3000  # per router, mode and round
    rounds: int = ROUNDS
    engines: int = 4
    prompt_tokens: int = 200
    seed: int = 0
    profile_dir: Path | None = None  # py-spy laneway's rounds, the stacks written here


def parse_peers(text: str) -> tuple[str, ...]:
    peers = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    named = (*PEER_COMMANDS, FLOOR, *ENVOY_PEERS)
    unknown = [p for p in peers if p not in named and _baseline(p) is None]
    if not peers or unknown:
        known = ", ".join((*named, f"{BASELINE}DIR", f"{PICKER_BASELINE}DIR"))
        raise UsageError(f"--against takes one or more of {known}; got {text!r}")
    for peer in peers:
        where = _baseline(peer)
        if where is not None and not (where / "laneway" / "gateway" / "__init__.py").is_file():
            raise UsageError(
                f"{peer}: {where} holds no laneway package with its gateway; "
                "make one with `pip install --no-deps --target DIR CHECKOUT`"
            )
    return peers


def _baseline(peer: str) -> Path | None:
    """Where a `laneway@DIR` or `envoy+laneway@DIR` peer's laneway is; None for others."""
    for prefix in (BASELINE, PICKER_BASELINE):
        if peer.startswith(prefix):
            return Path(peer.removeprefix(prefix)).expanduser().resolve()
    return None


def check_against(options: AgainstOptions) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        raise UsageError("--against needs at least 2 CPUs: one for the routers, one for the rest")
    if options.concurrency < 1 or options.requests < 1 or options.rounds < 1:
        raise UsageError("--against needs a positive concurrency, number of requests and of rounds")
    if options.profile_dir is not None:
        # Made here, before the run, so that a folder that cannot be is a usage error.
        try:
            options.profile_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(
                f"--profile: cannot create {options.profile_dir}: {error.strerror or error}"
            ) from None


# -- results (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterRun:
    """One router (or the direct path) in one mode, its rounds added up."""

    router: str
    mode: str
    requests: int
    errors: int
    wall_s: float
    cpu_s: float  # of the router process; 0 on the direct path
    e2e: Distribution | None  # successful requests
    round_cpu_ms: tuple[float | None, ...] = ()  # CPU ms per successful request, each round

    @property
    def requests_per_s(self) -> float:
        return (self.requests - self.errors) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_request(self) -> float | None:
        ok = self.requests - self.errors
        return self.cpu_s * 1000 / ok if ok and self.router != DIRECT else None


@dataclass(frozen=True)
class AgainstReport:
    machine: str
    date: str
    command: str
    placement: str
    load_average: float
    versions: tuple[tuple[str, str], ...]
    runs: tuple[RouterRun, ...]
    profiles: tuple[Profile, ...] = ()

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        for run, data in zip(self.runs, document["runs"], strict=True):
            data["requests_per_s"] = run.requests_per_s
            data["cpu_ms_per_request"] = run.cpu_ms_per_request
        return document


@dataclass(frozen=True)
class PickerRatio:
    """A picker behind Envoy against the cheaper floor, in one mode: each round's ratio
    (against that round's cheaper floor) and the rounds' added up."""

    mode: str
    picker: str
    cheaper_floor: str  # over the rounds added up
    ratio: float
    round_ratios: tuple[float, ...]


def picker_ratios(runs: Sequence[RouterRun]) -> list[PickerRatio]:
    """Every laneway picker behind Envoy against the cheaper of the floors measured."""
    ratios = []
    for mode in MODES:
        here = {run.router: run for run in runs if run.mode == mode.name}
        floors = [here[name] for name in FLOORS if name in here]
        if not floors:
            continue
        for run in here.values():
            if not _is_laneway_picker(run.router) or run.cpu_ms_per_request is None:
                continue
            cheaper = min(floors, key=lambda floor: floor.cpu_ms_per_request or float("inf"))
            if not cheaper.cpu_ms_per_request:
                continue
            per_round = []
            for index, cpu in enumerate(run.round_cpu_ms):
                floor_cpu = [f.round_cpu_ms[index] for f in floors if index < len(f.round_cpu_ms)]
                known = [value for value in floor_cpu if value]
                if cpu is not None and known:
                    per_round.append(cpu / min(known))
            ratios.append(
                PickerRatio(
                    mode=mode.name,
                    picker=run.router,
                    cheaper_floor=cheaper.router,
                    ratio=run.cpu_ms_per_request / cheaper.cpu_ms_per_request,
                    round_ratios=tuple(per_round),
                )
            )
    return ratios


def _is_laneway_picker(router: str) -> bool:
    return router == envoy_peers.ENVOY_LANEWAY or router.startswith(PICKER_BASELINE)


def render_picker_ratios(ratios: Sequence[PickerRatio]) -> list[str]:
    if not ratios:
        return []
    header = ("mode", "picker", "cheaper floor", "CPU vs it", "each round", "spread")
    rows = [
        (
            ratio.mode,
            ratio.picker,
            ratio.cheaper_floor,
            f"{ratio.ratio:.2f}x",
            " ".join(f"{value:.2f}x" for value in ratio.round_ratios) or "-",
            f"{min(ratio.round_ratios):.2f}-{max(ratio.round_ratios):.2f}x"
            if ratio.round_ratios
            else "-",
        )
        for ratio in ratios
    ]
    return [
        "",
        "laneway's picker against the cheaper floor (Envoy's CPU and the picker's together; "
        "each round against that round's cheaper floor)",
        *format_table(header, rows),
    ]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def render_against(report: AgainstReport) -> list[str]:
    header = (
        "mode", "router", "req/s", "p50", "p99", "added p50", "added p99",
        "CPU ms/req", "CPU vs laneway", "errors",
    )  # fmt: skip
    rows = []
    for mode in MODES:
        runs = {run.router: run for run in report.runs if run.mode == mode.name}
        direct, ours = runs.get(DIRECT), runs.get(LANEWAY)
        for run in runs.values():
            cpu = run.cpu_ms_per_request
            base = ours.cpu_ms_per_request if ours else None
            rows.append(
                (
                    f"{mode.name} ({mode.output_tokens} tokens)",
                    run.router,
                    f"{run.requests_per_s:.0f}",
                    _ms(run.e2e.p50 if run.e2e else None),
                    _ms(run.e2e.p99 if run.e2e else None),
                    _ms(_added(run, direct, "p50")),
                    _ms(_added(run, direct, "p99")),
                    "-" if cpu is None else f"{cpu:.3f}",
                    f"{cpu / base:.2f}x" if cpu is not None and base else "-",
                    str(run.errors),
                )
            )
    versions = ", ".join(f"{name} {version}" for name, version in report.versions)
    return [
        f"laneway beside other routers ({report.machine}; load average "
        f"{report.load_average:.2f} at the start; {report.placement}; {versions})",
        *format_table(header, rows),
        *render_picker_ratios(picker_ratios(report.runs)),
        *render_profiles(report.profiles),
    ]


def _added(run: RouterRun, direct: RouterRun | None, which: str) -> float | None:
    if run.router == DIRECT or direct is None or run.e2e is None or direct.e2e is None:
        return None
    return float(getattr(run.e2e, which)) - float(getattr(direct.e2e, which))


# -- the peers' environment -------------------------------------------------------------------


def ensure_peers(venv: Path, peers: Sequence[str], profiling: bool = False) -> dict[str, str]:
    """Install missing peers (and py-spy, when profiling) into `venv`, created if absent;
    their versions by name."""
    versions = {FLOOR: _floor_version()} if FLOOR in peers else {}
    versions |= {"envoy": envoy_version()} if set(peers) & set(ENVOY_PEERS) else {}
    versions |= {p: str(where) for p in peers if (where := _baseline(p)) is not None}
    packages = [peer for peer in peers if peer in PEER_COMMANDS] + ([PY_SPY] if profiling else [])
    if not packages:
        return versions
    python = venv / "bin" / "python"
    if not python.exists():
        progress(f"creating {venv} for the peer routers")
        subprocess.run([sys.executable, "-P", "-m", "venv", str(venv)], check=True)
    missing = [name for name in packages if not (venv / "bin" / _command_of(name)).exists()]
    if missing:
        progress(f"installing {', '.join(missing)} into {venv}")
        install = [str(python), "-P", "-m", "pip", "install", "-q", *missing]
        done = subprocess.run(install, capture_output=True, text=True)
        if done.returncode != 0:
            raise UsageError(f"cannot install {', '.join(missing)}: {done.stderr[-2000:]}")
    return versions | {name: _installed_version(python, name) for name in packages}


def _command_of(package: str) -> str:
    return PEER_COMMANDS[package][0] if package in PEER_COMMANDS else package


def _floor_version() -> str:
    loop = event_loop_factory()
    name = "uvloop" if loop is not None else "asyncio"
    return f"Python {platform.python_version()}, {name} loop, aiohttp {aiohttp.__version__}"


def _installed_version(python: Path, package: str) -> str:
    shown = subprocess.run(
        [str(python), "-P", "-m", "pip", "show", package],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in shown.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_peer(
    children: Children, venv: Path, peer: str, workers: Sequence[str], cpu: int
) -> ChildProcess:
    """The peer, born pinned to `cpu` (so its runtime sizes its threads to one core)."""
    port = _free_port()
    if peer == FLOOR:
        argv = ["taskset", "-c", str(cpu), *floor_proxy.argv(workers, port)]
        return children.start(peer, argv, floor_proxy.READY_LINE)
    script, *words = PEER_COMMANDS[peer]
    flags = [
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
        "--policy", "round_robin", "--log-level", "error",
        "--prometheus-port", str(_free_port()),
    ]  # fmt: skip
    # taskset execs the router, so the pid measured is the router's own.
    argv = ["taskset", "-c", str(cpu), str(venv / "bin" / script), *words, *flags]
    announce = f"echo '{READY_LINE}http://127.0.0.1:{port}'; exec \"$@\""
    return children.start(peer, ["sh", "-c", announce, "sh", *argv], READY_LINE)


async def wait_serving(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    """Poll until the router answers a completion (it may still be probing its workers)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                if response.status == 200:
                    await response.read()
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise UsageError(f"the router at {url} answered no completion within 60 s")
        await asyncio.sleep(0.5)


def _fresh_session() -> aiohttp.ClientSession:
    """A session per round: connections idle through the other routers' rounds would meet
    each router's idle keep-alive close (the gateway's is 15 s) as they are reused."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


def _fixed(url: str) -> Callable[[], str]:
    return lambda: url


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Result:
    ok: bool
    e2e_s: float


async def _complete(
    session: aiohttp.ClientSession, next_url: Callable[[], str], body: dict[str, Any]
) -> _Result:
    begun = time.perf_counter()
    async with session.post(next_url(), json=body) as response:
        data = await response.read()
    ok = response.status == 200 and b'"choices"' in data
    return _Result(ok=ok, e2e_s=time.perf_counter() - begun)


async def _stream(
    session: aiohttp.ClientSession, next_url: Callable[[], str], body: dict[str, Any]
) -> _Result:
    result = await stream_request(session, next_url(), body)
    return _Result(ok=result.status == 200 and result.error is None, e2e_s=result.e2e_s)


# The next URL to send to; the router (Envoy and its picker together for the Envoy peers).
Target = tuple[Callable[[], str], ChildProcess | Together | None]


async def measure(
    options: AgainstOptions, targets: dict[str, Target]
) -> tuple[list[RouterRun], list[Profile]]:
    """Each router's runs, mode by mode, and with `options.profile_dir` laneway's profile of
    each mode."""
    content = PromptFactory(default_tokenizer()).chat_content(
        random.Random(options.seed), options.prompt_tokens
    )
    runs = []
    profiles = []
    for mode in MODES:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": mode.output_tokens,
            "stream": mode.stream,
        }
        send = _stream if mode.stream else _complete
        progress(f"{mode.name}: warming up every router")
        for next_url, _ in targets.values():
            async with _fresh_session() as session:
                await in_closed_loop(functools.partial(send, session, next_url, body), 16, 200)
        totals: dict[str, tuple[list[_Result], list[float]]] = {
            name: ([], [0.0, 0.0]) for name in targets
        }
        each_round: dict[str, list[float | None]] = {name: [] for name in targets}
        profiled = PROFILED if options.profile_dir is not None else ()
        stacks: dict[str, list[str]] = {name: [] for name in profiled if name in targets}
        for round_index in range(options.rounds):
            order = list(targets) if round_index % 2 == 0 else list(reversed(targets))
            for name in order:
                progress(f"{mode.name}: {name}, round {round_index + 1} of {options.rounds}")
                next_url, child = targets[name]
                results, sums = totals[name]
                sampler = None
                if options.profile_dir is not None and name in stacks and child is not None:
                    output = options.profile_dir / f"{name}-{mode.name}-{round_index + 1}.txt"
                    sampler = Sampler(options.venv / "bin" / PY_SPY, child.pid, output)
                cpu_before = child.cpu_seconds() if child else 0.0
                begun = time.perf_counter()
                async with _fresh_session() as session:
                    this_round = await in_closed_loop(
                        functools.partial(send, session, next_url, body),
                        options.concurrency,
                        options.requests,
                    )
                sums[0] += time.perf_counter() - begun
                cpu_s = (child.cpu_seconds() - cpu_before) if child else 0.0
                sums[1] += cpu_s
                results += this_round
                answered = sum(result.ok for result in this_round)
                each_round[name].append(cpu_s * 1000 / answered if answered and child else None)
                if sampler is not None:
                    stacks[name].append(await asyncio.to_thread(sampler.stop))
        for name, (results, (wall_s, cpu_s)) in totals.items():
            ok = [r.e2e_s for r in results if r.ok]
            runs.append(
                RouterRun(
                    router=name,
                    mode=mode.name,
                    requests=len(results),
                    errors=len(results) - len(ok),
                    wall_s=wall_s,
                    cpu_s=cpu_s,
                    e2e=Distribution.of(ok),
                    round_cpu_ms=tuple(each_round[name]),
                )
            )
        for name, sampled in stacks.items():
            assert options.profile_dir is not None  # stacks are sampled only then
            ours = next(run for run in runs if run.router == name and run.mode == mode.name)
            path = options.profile_dir / f"{name}-{mode.name}.txt"
            collapsed = "".join(sampled)
            path.write_text(collapsed)
            # The picker's CPU is counted with Envoy's: its shares only, no ms per request.
            cpu = ours.cpu_ms_per_request if name == LANEWAY else None
            label = mode.name if name == LANEWAY else f"{mode.name}, the picker of {name}"
            profiles.append(summarize(collapsed, label, cpu, str(path)))
    return runs, profiles


async def run_against(options: AgainstOptions, command: str) -> AgainstReport:
    load_average = os.getloadavg()[0]
    profiling = options.profile_dir is not None
    versions = await asyncio.to_thread(ensure_peers, options.venv, options.peers, profiling)
    cpus = sorted(os.sched_getaffinity(0))
    router_cpu, other_cpus = cpus[-1], cpus[:-1]
    async with Children() as children:
        progress(f"starting {options.engines} zero-service-time engines")
        engines = [
            await children.start_laneway_async("sim", engine_args(), name=f"engine {i}")
            for i in range(options.engines)
        ]
        urls = [engine.url for engine in engines]
        for pid in (*(engine.pid for engine in engines), os.getpid()):
            pin(pid, other_cpus)
        progress("starting the laneway gateway and the peers, each pinned to one CPU")
        gateway = await start_gateway(children, gateway_config(urls))
        pin(gateway.pid, [router_cpu])
        peers: dict[str, ChildProcess | Together] = {}
        for peer in options.peers:
            if peer in ENVOY_PEERS or peer.startswith(PICKER_BASELINE):
                documents = gateway_config(urls)
                peers[peer] = await start_envoy_peer(
                    children, peer, urls, documents, router_cpu, laneway_from=_baseline(peer)
                )
            elif peer.startswith(BASELINE):
                env = {"PYTHONPATH": str(_baseline(peer))}
                peers[peer] = await start_gateway(children, gateway_config(urls), env=env)
                pin(peers[peer].pid, [router_cpu])
            else:
                peers[peer] = await asyncio.to_thread(
                    start_peer, children, options.venv, peer, urls, router_cpu
                )
        probe = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "max_tokens": 1}  # fmt: skip
        async with aiohttp.ClientSession() as session:
            for child in peers.values():
                await wait_serving(session, child.url, probe)
        cycle = itertools.cycle(urls)
        path = "/v1/chat/completions"
        targets: dict[str, Target] = {
            DIRECT: (lambda: next(cycle) + path, None),
            **{
                name: (_fixed(child.url + path), child)
                for name, child in {LANEWAY: gateway, **peers}.items()
            },
        }
        runs, profiles = await children.watch(measure(options, targets))
    return AgainstReport(
        machine=machine_description(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command=command,
        placement=(
            f"every router alone in turn on CPU {router_cpu}, engines and client on "
            f"{','.join(map(str, other_cpus))}"
        ),
        load_average=load_average,
        versions=tuple(sorted(versions.items())),
        runs=tuple(runs),
        profiles=tuple(profiles),
    )
