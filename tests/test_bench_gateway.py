"""`laneway bench gateway`: honest arithmetic on the samples, and a short real run's structure."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.client import scrape, total
from support.marks import marked_environment, processes_marked

from laneway.bench.gateway.classify import time_classification
from laneway.bench.gateway.config import BenchOptions, check_options, gateway_config
from laneway.bench.gateway.report import render
from laneway.bench.gateway.results import (
    BenchReport,
    LevelResult,
    PhaseCpu,
    add_buckets,
    bucket_quantile,
    buckets_between,
    mean_in_flight,
    overhead_buckets,
    own_time,
    path_result,
    poisson_quantile,
    send_clumps,
)
from laneway.bench.gateway.run import measure_levels, round_think, start_engines
from laneway.bench.harness.closed_loop import in_closed_loop, think_time
from laneway.bench.harness.live_cluster import start_gateway
from laneway.bench.harness.procs import Children, laneway_argv
from laneway.bench.harness.stream import StreamResult
from laneway.cli import main
from laneway.errors import UsageError
from laneway.tables import format_table

NO_CPU = PhaseCpu(0.0, 0.0, 0.0)
# Pinning the gateway to a CPU of its own needs two.
OWN_CORE = ["--own-core"] if len(os.sched_getaffinity(0)) >= 2 else []
# Only a guard against a hang, under pytest-timeout's 300 s: a loaded machine may take its
# time, and a test must not fail for it.
HANG_S = 240


def result(e2e: float, status: int = 200, error: str | None = None) -> StreamResult:
    return StreamResult(status, {}, e2e / 2, (e2e / 4,), e2e, 2, error)


def test_a_path_result_counts_errors_and_keeps_them_out_of_the_latencies() -> None:
    samples = [result(0.010), result(0.020), result(0.5, status=429), result(9.0, error="broke")]
    path = path_result(samples, wall_s=2.0, cpu=NO_CPU)
    assert (path.requests, path.errors) == (4, 2)
    assert path.e2e is not None
    assert path.e2e.max == 0.020
    assert path.requests_per_s == 1.0  # two good requests in two seconds


def test_added_latency_is_the_difference_of_percentiles_and_cpu_gives_req_per_core() -> None:
    direct = path_result([result(0.010)] * 99 + [result(0.030)], 1.0, PhaseCpu(0.6, 0.4, 0.0))
    gateway = path_result([result(0.012)] * 99 + [result(0.040)], 2.0, PhaseCpu(0.8, 0.4, 0.5))
    level = LevelResult(50, direct, gateway)
    assert level.added_p50_s == pytest.approx(0.002)
    assert direct.e2e is not None
    assert gateway.e2e is not None
    assert level.added_p99_s == pytest.approx(gateway.e2e.p99 - direct.e2e.p99)
    assert level.requests_per_core_s == pytest.approx(200)  # 100 requests in 0.5 CPU s
    assert gateway.cores_busy(gateway.cpu.gateway) == pytest.approx(0.25)
    all_failed = path_result([result(1.0, status=503)], 1.0, NO_CPU)
    assert LevelResult(1, all_failed, gateway).added_p99_s is None
    assert LevelResult(1, direct, direct).requests_per_core_s is None  # no gateway CPU


def test_streams_in_flight_are_littles_law_over_the_successful_requests() -> None:
    # Four half-second streams in one second: two open at once on average.
    assert mean_in_flight([0.5] * 4, wall_s=1.0) == 2.0
    assert mean_in_flight([], wall_s=1.0) == 0.0
    assert mean_in_flight([0.5], wall_s=0.0) == 0.0
    failed = [result(0.5, status=503), result(0.5, error="broke")]
    path = path_result([result(0.5)] * 4 + failed, wall_s=2.0, cpu=NO_CPU)
    assert path.in_flight == 1.0  # the failed ones left out, as from the latencies


def test_think_times_are_exponential_of_the_mean_and_the_same_for_a_seed() -> None:
    draw = think_time(20.0, random.Random(7))
    assert draw is not None
    draws = [draw() for _ in range(20_000)]
    again = think_time(20.0, random.Random(7))
    assert again is not None
    assert [again() for _ in range(100)] == draws[:100]
    other = think_time(20.0, random.Random(8))
    assert other is not None
    assert [other() for _ in range(100)] != draws[:100]
    assert all(d >= 0 for d in draws)
    # Seconds, of mean 20 ms; the standard error of 20,000 draws' mean is 0.7 % of it.
    assert sum(draws) / len(draws) == pytest.approx(0.020, rel=0.05)
    # Exponential, not constant: a share 1/e of the draws exceeds the mean.
    assert sum(d > 0.020 for d in draws) / len(draws) == pytest.approx(0.368, abs=0.02)
    assert think_time(0.0, random.Random(7)) is None


async def test_a_closed_loop_with_think_time_waits_before_every_job() -> None:
    loop = asyncio.get_running_loop()
    begun = loop.time()
    starts: list[float] = []
    thought: list[float] = []

    def think() -> float:
        thought.append(0.03)
        return 0.03

    async def job() -> float:
        starts.append(loop.time() - begun)
        await asyncio.sleep(0.01)
        return 0.01

    results = await in_closed_loop(job, 2, 4, think)
    assert results == [0.01] * 4  # the think time is in no job's result
    assert len(thought) == 4  # once before each job
    # A sleep ends no earlier than asked (but for the clock's resolution): each worker's
    # first job after one think time, its second after a job and another think time.
    first, second = sorted(starts)[:2], sorted(starts)[2:]
    assert min(first) >= 0.03 - 0.001
    assert min(second) >= 0.03 + 0.01 + 0.03 - 0.001


INF = float("inf")


@pytest.mark.parametrize(
    ("q", "cumulative", "expected"),
    [
        # 100 observations: 50 up to 1 ms, 40 in (1, 2], 10 in (2, 5]: linear within a bucket.
        (0.5, {0.001: 50, 0.002: 90, 0.005: 100, INF: 100}, 0.001),
        (0.7, {0.001: 50, 0.002: 90, 0.005: 100, INF: 100}, 0.0015),
        (0.99, {0.001: 50, 0.002: 90, 0.005: 100, INF: 100}, 0.0047),
        # The first bucket starts at zero.
        (0.5, {0.001: 10, INF: 10}, 0.0005),
        # Past the highest finite edge: that edge, as histogram_quantile says.
        (0.99, {0.001: 10, 0.002: 10, INF: 20}, 0.002),
    ],
)
def test_a_quantile_from_buckets_is_prometheus_histogram_quantile(
    q: float, cumulative: dict[float, float], expected: float
) -> None:
    assert bucket_quantile(q, cumulative) == pytest.approx(expected)


METRICS_TEXT = """\
# HELP laneway_gateway_overhead_seconds own time
# TYPE laneway_gateway_overhead_seconds histogram
laneway_gateway_overhead_seconds_bucket{{le="0.001",stage="stream"}} {fast}
laneway_gateway_overhead_seconds_bucket{{le="0.002",stage="stream"}} {fast}
laneway_gateway_overhead_seconds_bucket{{le="+Inf",stage="stream"}} {all}
laneway_gateway_overhead_seconds_count{{stage="stream"}} {all}
laneway_gateway_overhead_seconds_sum{{stage="stream"}} 1.0
# HELP laneway_gateway_tbt_seconds gaps
# TYPE laneway_gateway_tbt_seconds histogram
laneway_gateway_tbt_seconds_bucket{{le="+Inf",lane="interactive",pool="p"}} 7.0
laneway_gateway_tbt_seconds_count{{lane="interactive",pool="p"}} 7.0
laneway_gateway_tbt_seconds_sum{{lane="interactive",pool="p"}} 1.0
"""


def test_the_gateways_own_time_is_what_its_histogram_counted_between_two_reads() -> None:
    before = overhead_buckets(METRICS_TEXT.format(fast=10, all=10))
    after = overhead_buckets(METRICS_TEXT.format(fast=108, all=110))
    assert before == {"stream": {0.001: 10, 0.002: 10, INF: 10}}
    counted = buckets_between(before, after)
    assert counted == {"stream": {0.001: 98, 0.002: 98, INF: 100}}
    # Two rounds add up; a stage one round lacks counts as zero there.
    both = add_buckets(counted, {"chunk": {0.001: 1, INF: 1}, **counted})
    assert both["stream"][INF] == 200
    assert both["chunk"] == {0.001: 1, INF: 1}
    stream = own_time("stream", counted["stream"])
    assert stream is not None
    assert (stream.count, stream.within_goal) == (100, 0.98)
    assert stream.p50_s == pytest.approx(0.001 * 50 / 98)
    assert stream.p99_s == 0.002  # past the last finite edge
    assert own_time("chunk", {}) is None


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"concurrency": ()}, "--concurrency"),
        ({"concurrency": (0, 5)}, "--concurrency"),
        ({"requests": 0}, "--requests"),
        ({"prompt_tokens": 5000}, "--prompt-tokens"),
        ({"output_tokens": 0}, "--output-tokens"),
        ({"classify_tokens": 100}, "--classify-tokens"),
        ({"engine_profile": "a100"}, "--engine-profile must be one of h100-llama3-8b, "),
        ({"engines": 0}, "--engines must be at least 1, got 0"),
        ({"think_ms": -1.0}, "--think-ms must be 0"),
        ({"think_ms": float("inf")}, "--think-ms must be 0"),
    ],
)
def test_options_that_cannot_work_name_their_flag(changes: dict[str, object], flag: str) -> None:
    with pytest.raises(UsageError, match=flag):
        check_options(BenchOptions(**changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "gateway", "--concurrency", "x"],
        ["bench", "gateway", "--requests", "0"],
        ["bench", "gateway", "--engines", "0"],
        ["bench", "gateway", "--think-ms", "-5"],
        ["bench", "gateway", "--json", "/no/such/folder/out.json"],
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_tables_refuse_rows_of_the_wrong_width() -> None:
    assert format_table(("a", "b"), [("x", "1")]) == ["a  b", "x  1"]
    with pytest.raises(ValueError, match="cells"):
        format_table(("a", "b"), [("x",)])


def test_a_table_rule_sits_under_the_header_as_wide_as_each_column() -> None:
    lines = format_table(("a", "bb"), [("xyz", "1")], rule=True)
    assert lines == ["a    bb", "---  --", "xyz   1"]


def test_the_long_prompt_reaches_the_batch_pool_by_bounds_and_by_exact_count() -> None:
    options = BenchOptions(classify_tokens=20_000, classify_repeats=2)
    classified = asyncio.run(time_classification(options, time.perf_counter))
    assert classified.bounds_pool == classified.exact_pool == "batch"
    assert classified.bounds_decided_s.count == classified.exact_count_s.count == 2
    assert classified.prompt_bytes > classified.prompt_tokens


def test_a_short_run_measures_both_paths_at_every_level(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    run = subprocess.run(
        laneway_argv(
            "bench",
            "gateway",
            "--concurrency",
            "1,8",
            "--requests",
            "24",
            "--classify-tokens",
            "6000",
            *OWN_CORE,
            "--json",
            str(output),
        ),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(output.read_text())
    assert [level["concurrency"] for level in report["levels"]] == [1, 8]
    for level in report["levels"]:
        for path in ("direct", "gateway"):
            assert level[path]["requests"] == 24
            assert level[path]["errors"] == 0
            assert level[path]["e2e"]["count"] == 24
        assert level["gateway"]["cpu"]["gateway"] > 0
        assert level["direct"]["cpu"]["gateway"] == 0
        # The gateway's own measure: every stream through it, and none of the direct ones.
        own = {stage["stage"]: stage for stage in level["gateway"]["own"]}
        assert own["stream"]["count"] == own["request"]["count"] == 24
        assert own["chunk"]["count"] >= 24
        assert 0 < own["request"]["p50_s"] <= own["request"]["p99_s"]
        assert level["direct"]["own"] == []
        assert level["direct"]["cpu"]["engine"] > 0
    assert report["classification"]["bounds_pool"] == "batch"
    stalls = report["classification"]["loop_stalls"]
    assert [stall["where"] for stall in stalls] == ["a worker process", "a thread", "nothing"]
    assert all(0 <= stall["p50_s"] <= stall["max_s"] for stall in stalls)
    expected = "gateway alone on CPU" if OWN_CORE else "all processes share"
    assert report["placement"].startswith(expected)
    assert report["command"].startswith("laneway bench gateway --concurrency 1,8")
    table = run.stdout.splitlines()
    assert table[1].split()[0] == "concurrency"
    assert [line.split()[0] for line in table[2:4]] == ["1", "8"]
    own_header = table.index(next(line for line in table if line.startswith("concurrency  stream")))
    assert [line.split()[0] for line in table[own_header + 1 : own_header + 3]] == ["1", "8"]
    assert "through the gateway" in run.stderr  # progress goes to stderr


@pytest.mark.parametrize(
    ("engines", "think_ms", "said"),
    [
        (1, 0.0, "; 1 engine; no think time)"),
        (2, 20.0, "; 2 engines; think time exponential, mean 20 ms)"),
    ],
)
def test_render_lists_every_level_in_order(engines: int, think_ms: float, said: str) -> None:
    options = BenchOptions(classify_tokens=5000, classify_repeats=1)
    classification = asyncio.run(time_classification(options, time.perf_counter))
    direct = path_result([result(0.01)] * 50, 1.0, PhaseCpu(0.1, 0.1, 0.1))
    levels = tuple(LevelResult(c, direct, direct) for c in (1, 50, 200))
    report = BenchReport(
        "a machine",
        "today",
        "laneway bench gateway",
        "shared",
        0.5,
        levels,
        classification,
        engines=engines,
        think_ms=think_ms,
    )
    lines = render(report)
    assert "a machine" in lines[0]
    assert said in lines[0]
    assert "Little's law" in lines[0]
    assert lines[1].split()[-4:-1] == ["in", "flight", "direct/gw"]
    assert [line.split()[0] for line in lines[2:5]] == ["1", "50", "200"]
    assert lines[2].split()[-2] == "0.5/0.5"  # 50 streams of 10 ms in 1 s
    document = json.loads(json.dumps(report.to_json()))
    assert document["levels"][2]["added_p50_s"] == 0
    assert document["levels"][2]["gateway"]["in_flight"] == pytest.approx(0.5)
    assert (document["engines"], document["think_ms"]) == (engines, think_ms)


async def test_clients_with_think_time_reach_every_engine_with_fewer_streams_open() -> None:
    options = BenchOptions(
        concurrency=(8,), requests=24, prompt_tokens=20, output_tokens=4, engines=2, think_ms=20
    )
    async with asyncio.timeout(HANG_S), Children() as children:
        engines = await start_engines(children, options)
        gateway = await start_gateway(children, gateway_config([e.url for e in engines]))
        [level] = await measure_levels(options, engines, gateway)
        served = [total(await scrape(e.url), "vllm:request_success_total") for e in engines]
    # Each round's 8 clients were open or thinking at most the round's wall time, so the
    # streams open on average are at most the 8 less the think time (its draws are the
    # seed's, 12 a round) over the wall time; without think time they would be near 8.
    rounds = [round_think(options, 8, index) for index in range(2)]
    thought_s = sum(think() for think in rounds if think is not None for _ in range(12))
    assert thought_s > 0
    for path in (level.direct, level.gateway):
        assert (path.requests, path.errors) == (24, 0)
        assert 0 < path.in_flight <= 8 - (thought_s - 0.001) / path.wall_s < 8
    assert all(count > 0 for count in served), served
    # Every request of both paths, the warm-up's (24 each) too, reached one of the engines.
    assert sum(served) == 2 * (24 + 24)


def _resource_tracker(pid: int) -> bool:
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_kill_mid_run_stops_the_engine_and_the_gateway(
    marker: str, signum: signal.Signals
) -> None:
    with subprocess.Popen(
        laneway_argv("bench", "gateway", "--concurrency", "20", "--requests", "1000000"),
        stderr=subprocess.PIPE,
        text=True,
        env=marked_environment(marker),
    ) as bench:
        try:
            assert bench.stderr is not None
            next(line for line in bench.stderr if "through the gateway" in line)
            # The bench, its engine and its gateway, and multiprocessing's resource tracker:
            # the bench measured the loop's stall while its own worker process counted.
            running = [pid for pid in processes_marked(marker) if not _resource_tracker(pid)]
            assert len(running) == 3
            bench.send_signal(signum)
            _, stderr = bench.communicate(timeout=HANG_S)
        finally:
            bench.kill()  # and leaving the with block closes the pipe
    assert bench.returncode == 130, stderr
    assert "interrupted" in stderr
    assert "Traceback" not in stderr
    assert processes_marked(marker) == []


def test_poisson_quantiles_match_the_distribution() -> None:
    # Poisson(1): P(X <= 3) = 0.981, P(X <= 4) = 0.996.
    assert poisson_quantile(0.99, 1.0) == 4
    assert poisson_quantile(0.98, 1.0) == 3
    assert poisson_quantile(0.99, 0.0) == 0


def test_evenly_spaced_sends_are_no_clump_and_sends_together_are() -> None:
    # One send a millisecond for a second: each has itself and the next ten within 10 ms.
    even = send_clumps([i / 1000 for i in range(1000)])
    assert even is not None
    assert even.p50 == 11
    assert even.poisson_p99 == 1 + poisson_quantile(0.99, 1000 / 0.999 * 0.010)
    # The same thousand sends, twenty at a time every twenty milliseconds.
    together = send_clumps([(i // 20) * 0.020 for i in range(1000)])
    assert together is not None
    assert together.p99 == 20 > together.poisson_p99
    assert send_clumps([5.0]) is None
    assert send_clumps([1.0, 1.0]) is None  # no time between them: no rate
