"""The elastic virtual-time cluster: a pool at zero queues and wakes after its cold start,
sleeps again after its down window, and GPU time counts the cold start."""

from __future__ import annotations

import json
from pathlib import Path

from laneway.api import Lane
from laneway.autoscale import ScalePolicy, ScaleSignal
from laneway.bench.autoscale import DayScenario, arrivals
from laneway.cli import main
from laneway.simulator.elastic import Arrival, ElasticPool, run_elastic
from laneway.simulator.profiles import PROFILES
from laneway.simulator.scheduler import SchedulerConfig

PROFILE = PROFILES["h200-llama3-8b"]
ENGINE = SchedulerConfig("chunked", 2048, 1024, 256, 64, 131072)
SLO = (0.3, 0.03)
BATCH_AT_ZERO = ScalePolicy(
    min_replicas=0,
    max_replicas=2,
    signal=ScaleSignal.PROMPT_TOKENS,
    target_per_replica=65536,
    scale_down_window_s=120,
)


def run(cold_start_s: float) -> tuple[list[float], list[int], float]:
    documents = [Arrival(100.0, 32768, 64, Lane.BATCH) for _ in range(2)]
    pool = ElasticPool("batch", False, ENGINE, 0, BATCH_AT_ZERO)
    result = run_elastic([pool], PROFILE, documents, 600.0, SLO, cold_start_s)
    assert result.unfinished == 0
    (trace,) = result.traces
    starts = [o.arrival_s + o.ttft_s for o in result.outcomes]
    return starts, list(trace.replicas), result.gpu_seconds


def test_a_pool_at_zero_queues_wakes_after_the_cold_start_and_sleeps_again() -> None:
    first_tokens, replicas, gpu_s = run(cold_start_s=60.0)
    assert replicas[0] == 0
    assert max(replicas) == 1  # 65,536 queued tokens at 65,536 per replica
    assert replicas[-1] == 0
    # Queued at 100 s, seen at the 105 s scrape, served after a 60 s cold start.
    assert min(first_tokens) >= 105.0 + 60.0
    # The GPU is held from the decision through the cold start until released.
    assert gpu_s >= 60.0 + 120.0


def test_a_longer_cold_start_costs_gpu_time_and_latency() -> None:
    quick, _, quick_gpu = run(cold_start_s=10.0)
    slow, _, slow_gpu = run(cold_start_s=90.0)
    assert min(slow) - min(quick) >= 80.0 - 15.0
    assert slow_gpu - quick_gpu >= 80.0 - 15.0


def test_the_day_has_a_diurnal_curve_and_batch_only_in_working_hours() -> None:
    day = DayScenario(day_s=3600.0, peak_rps=4.0, peak_to_trough=4.0, jobs=2)
    found = arrivals(day)
    chat = [a.at_s for a in found if a.pinned is None]
    night = sum(1 for t in chat if t < 360 or t > 3240)
    noon = sum(1 for t in chat if 1440 < t < 2160)
    assert noon >= 3 * night  # equal spans; peak/trough 4, less the Poisson noise
    batch = [a.at_s for a in found if a.pinned is Lane.BATCH]
    assert len(batch) == 2 * day.documents_per_job
    assert all(0.3 * 3600 <= t <= 0.75 * 3600 for t in batch)


def test_bench_autoscale_writes_the_issue_shape(tmp_path: Path) -> None:
    out = tmp_path / "day.json"
    code = main(
        ["bench", "autoscale", "--day-minutes", "10", "--peak-rps", "1", "--jobs", "1",
         "--documents-per-job", "2", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    for name in ("static", "elastic"):
        config = document["configs"][name]
        assert isinstance(config["gpu_hours"], float)
        assert 0.0 <= config["interactive"]["slo_attainment"] <= 1.0
        assert config["interactive"]["ttft_ms"]["p99"] > 0
        assert config["batch"]["completed"] == 2
        assert config["batch"]["p99_completion_s"] > 0
    assert document["configs"]["elastic"]["gpu_hours"] < document["configs"]["static"]["gpu_hours"]
