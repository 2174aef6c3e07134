"""The elastic virtual-time cluster: a pool at zero queues and wakes after its cold start,
sleeps again after its down window, and GPU time counts the cold start."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from laneway.api import Lane
from laneway.autoscale import ScalePolicy, ScaleSignal
from laneway.bench.autoscale.day import DayScenario, arrivals, in_flight_per_replica, plan
from laneway.bench.autoscale.sweep import chosen_cells, static_key, sweep_cells
from laneway.cli import main
from laneway.errors import UsageError
from laneway.simulator.elastic import Arrival, ElasticPool, poisson_arrivals, run_elastic
from laneway.simulator.profiles import PROFILES
from laneway.simulator.scheduler import SchedulerConfig

PROFILE = PROFILES["h200-llama3-8b"]
ENGINE = SchedulerConfig(
    kind="chunked",
    token_budget=2048,
    chunk_size=1024,
    max_num_seqs=256,
    max_partial_prefills=64,
    max_context=131072,
)
BATCH_AT_ZERO = ScalePolicy(
    min_replicas=0,
    max_replicas=2,
    signal=ScaleSignal.PROMPT_TOKENS,
    target_per_replica=65536,
    scale_down_window_s=120,
)


def run(cold_start_s: float) -> tuple[list[float], list[int], float]:
    documents = [
        Arrival(at_s=100.0, prompt_tokens=32768, output_tokens=64, pinned=Lane.BATCH)
        for _ in range(2)
    ]
    pool = ElasticPool(
        name="batch", interactive=False, engine=ENGINE, replicas=0, policy=BATCH_AT_ZERO
    )
    result = run_elastic([pool], PROFILE, documents, 600.0, cold_start_s)
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


def test_the_scaler_counts_a_document_until_it_ends_as_the_gateway_does() -> None:
    # The scaler reads the ledger's demand, the gateway's: a document's prompt tokens count
    # until it finishes, not only until its first token, so no replica goes while the
    # documents still decode.
    documents = [
        Arrival(at_s=10.0, prompt_tokens=32768, output_tokens=6000, pinned=Lane.BATCH)
        for _ in range(2)
    ]
    policy = replace(BATCH_AT_ZERO, target_per_replica=32768, scale_down_window_s=15)
    pool = ElasticPool(name="batch", interactive=False, engine=ENGINE, replicas=0, policy=policy)
    result = run_elastic([pool], PROFILE, documents, 300.0, cold_start_s=10.0)
    (trace,) = result.traces
    first_tokens = [o.arrival_s + o.ttft_s for o in result.outcomes]
    ends = [o.finished_s for o in result.outcomes]
    assert max(ends) - max(first_tokens) > 15.0 + 15.0  # decoding outlasts window + interval
    downs = [float(r.split("s ", 1)[0]) for r in trace.reasons if "scaling down" in r]
    assert downs
    assert min(downs) >= max(ends)
    assert trace.replicas[-1] == 0


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


CHAT_ENGINE = SchedulerConfig(
    kind="chunked",
    token_budget=896,
    chunk_size=896,
    max_num_seqs=64,
    max_partial_prefills=64,
    max_context=4096,
)


def chat_policy(target: int) -> ScalePolicy:
    return ScalePolicy(
        min_replicas=1,
        max_replicas=6,
        signal=ScaleSignal.IN_FLIGHT_REQUESTS,
        target_per_replica=target,
        scale_down_window_s=120,
    )


def test_an_elastic_pool_holds_its_count_for_a_down_window_before_it_shrinks() -> None:
    # The operator's first sight: no demand at the start of the day is not a reason to drop
    # the replicas the night left running before a whole down window has been seen.
    pool = ElasticPool(
        name="interactive", interactive=True, engine=CHAT_ENGINE, replicas=3, policy=chat_policy(10)
    )
    (trace,) = run_elastic([pool], PROFILE, [], 400.0).traces
    held = [n for at, n in zip(trace.at_s, trace.replicas, strict=True) if at < 120]
    assert held
    assert set(held) == {3}
    assert trace.replicas[-1] == 1


def test_an_interactive_pool_grows_on_requests_in_flight_and_serves_after_the_cold_start() -> None:
    rng = random.Random(7)
    times = poisson_arrivals(rng, lambda _: 30.0, 30.0, 240.0)
    trace = [
        Arrival(at_s=t, prompt_tokens=rng.randint(200, 1500), output_tokens=rng.randint(50, 250))
        for t in times
    ]
    pool = ElasticPool(
        name="interactive", interactive=True, engine=CHAT_ENGINE, replicas=1, policy=chat_policy(10)
    )
    result = run_elastic([pool], PROFILE, trace, 240.0, cold_start_s=60.0)
    (pool_trace,) = result.traces
    assert max(pool_trace.replicas) >= 3
    assert "scaling up 1 -> " in pool_trace.reasons[0]
    assert "inFlightRequests" in pool_trace.reasons[0]
    # Once the first added replicas are past their cold start, the TTFT target holds again.
    first_added = float(pool_trace.reasons[0].split("s ", 1)[0])
    late = [o for o in result.outcomes if o.arrival_s > first_added + 60.0 + 15.0]
    assert late
    assert sum(o.ttft_s <= 0.3 for o in late) >= 0.99 * len(late)
    assert result.unfinished == 0


def test_the_calibrated_target_grows_with_the_rate_and_shrinks_with_headroom() -> None:
    quiet = in_flight_per_replica(PROFILE, CHAT_ENGINE, 5.0)
    busy = in_flight_per_replica(PROFILE, CHAT_ENGINE, 20.0)
    assert 0 < quiet < busy
    day = DayScenario(peak_rps=20.0)
    assert plan(replace(day, headroom=0.4), PROFILE).interactive_target < (
        plan(replace(day, headroom=0.0), PROFILE).interactive_target
    )


def test_a_spike_multiplies_the_chat_rate_for_its_minutes() -> None:
    day = DayScenario(day_s=1800.0, peak_rps=20.0, jobs=0)
    spiked = replace(day, spike_factor=3.0, spike_at=0.5, spike_s=120.0)
    window = (900.0, 1020.0)

    def inside(found: list[Arrival]) -> int:
        return sum(1 for a in found if window[0] <= a.at_s < window[1])

    assert inside(arrivals(spiked)) >= 2.5 * inside(arrivals(day))
    assert spiked.chat_rate(899.0) == day.chat_rate(899.0)
    assert spiked.chat_rate(950.0) == 3 * day.chat_rate(950.0)


def test_the_sweep_changes_one_knob_per_cell_and_shares_static_runs() -> None:
    base = DayScenario()
    cells = sweep_cells(base)
    assert cells[0].day == base
    for cell in cells[1:]:
        changed = [f for f in vars(base) if getattr(cell.day, f) != getattr(base, f)]
        assert len(changed) == 1, cell.label
    statics = {static_key(cell.day) for cell in cells}
    assert static_key(replace(base, cold_start_s=120.0, headroom=0.0)) == static_key(base)
    assert len(statics) < len(cells)  # cold start and headroom cells reuse the base's


def test_a_sweep_in_parts_runs_the_cells_named_and_refuses_unknown_ones() -> None:
    base = DayScenario()
    chosen = chosen_cells(base, ["spike_factor=1.6", "headroom=0"])
    assert [cell.label for cell in chosen] == ["spike_factor=1.6", "headroom=0"]
    with pytest.raises(UsageError, match="--sweep-only peak_rps=7: no such cell"):
        chosen_cells(base, ["peak_rps=7"])


def test_bench_autoscale_sweep_draws_no_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "autoscale", "--sweep", "--plot", str(tmp_path / "day.png")]) == 2
    assert "--sweep draws no plot: drop --plot" in capsys.readouterr().err


def test_bench_autoscale_runs_one_configuration_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "elastic.json"
    code = main(
        ["bench", "autoscale", "--day-minutes", "10", "--peak-rps", "1", "--jobs", "0",
         "--configs", "elastic", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    assert list(document["configs"]) == ["elastic"]
    assert "fewer GPU-hours" not in capsys.readouterr().out  # nothing to compare against
    assert main(["bench", "autoscale", "--configs", "elastics"]) == 2
    assert "--configs elastics: one of static,elastic, static, elastic" in capsys.readouterr().err
