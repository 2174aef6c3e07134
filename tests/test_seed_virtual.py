"""`laneway bench seed --mode virtual`: routing, the JSON shape and bad flags."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from laneway.api import InferencePool, Lane, check_pool_set
from laneway.api.lending import LendingSpec
from laneway.bench.seed.live import gateway_documents
from laneway.cli import main
from laneway.ledger.lending import Role
from laneway.routing.lanes import NoFit, Route, RouteRequest, classify
from laneway.simulator.profiles import PROFILES
from laneway.simulator.runner import VirtualCluster
from laneway.simulator.seed import (
    CONFIG_NAMES,
    LENDING,
    LENDING_ENGINE,
    LONG_CONTEXT,
    PUBLIC_MODEL,
    SCRAPE_INTERVAL_S,
    TBT_SLO_S,
    ClusterConfig,
    SeedScenario,
    seed_configs,
    shared_engine_pools,
    tbt_token_budget,
)
from laneway.simulator.seed_experiment import SeedWorkload, run_virtual
from laneway.tokens import TokenBounds

H200 = PROFILES["h200-llama3-8b"]
# Small enough to run in a second, big enough that the long burst meets interactive traffic.
SMALL = SeedScenario(gpus=4, sessions=24, long_requests=3, long_tokens=16384, duration_s=8.0)


def pools_of(config: ClusterConfig) -> list[InferencePool]:
    return [pool.inference_pool([f"http://{pool.name}-0.virtual"]) for pool in config.pools]


def route(pools: list[InferencePool], prompt: int, output: int) -> str | None:
    ask = RouteRequest(PUBLIC_MODEL, TokenBounds(prompt, prompt), output)
    decision = classify(ask, pools)
    assert isinstance(decision, Route | NoFit)
    return decision.pool.name if isinstance(decision, Route) else None


@pytest.mark.parametrize(
    ("prompt", "output", "expected"),
    [
        (800, 200, "realtime"),  # short: the interactive lane
        (2048, 2048, "realtime"),  # at both caps exactly
        (2049, 10, "batch"),  # over the lane's prompt range
        (2000, 2500, "batch"),  # prompt fits, prompt + output does not fit the 4k context
        (65536, 512, "batch"),  # long documents go to batch
        (131000, 1000, None),  # no pool can hold it
    ],
)
def test_the_split_pools_route_by_length(prompt: int, output: int, expected: str | None) -> None:
    split = next(c for c in seed_configs(SeedScenario(), H200) if c.name == "split")
    assert route(pools_of(split), prompt, output) == expected


def test_the_tbt_budget_is_the_largest_that_meets_the_slo() -> None:
    from laneway.simulator.seed import _mixed_step_s

    budget = tbt_token_budget(H200, 64, 2048)
    assert (
        _mixed_step_s(H200, budget, 64, 2048)
        <= TBT_SLO_S
        < _mixed_step_s(H200, budget + 128, 64, 2048)
    )


def test_configs_use_the_same_gpus_and_keep_long_prompts_out_of_interactive_lanes() -> None:
    configs = seed_configs(SeedScenario(), H200)
    assert [c.name for c in configs] == list(CONFIG_NAMES)
    for config in configs:
        assert config.gpus == 8
        chosen = route(pools_of(config), 65536, 512)
        assert chosen == ("batch" if len(config.pools) > 1 else "unified")


def test_every_configuration_finishes_all_work() -> None:
    for config in seed_configs(SMALL, H200):
        result = run_virtual(config, H200, SMALL)
        assert len(result.batch_finished_at_s) == SMALL.long_requests, config.name
        assert result.interactive_rejected == 0
        assert result.interactive_completed == len(result.ttft_s)
        assert 0 < result.gpu_busy_s <= config.gpus * result.end_s


def test_whole_prefill_stalls_decodes_and_lanes_remove_the_stall() -> None:
    """The seed's finding, at small scale: a long prefill in a mixed pool stalls streams."""
    results = {c.name: run_virtual(c, H200, SMALL) for c in seed_configs(SMALL, H200)}
    long_prefill_s = 1.0  # a 16k prompt prefilled whole takes about 0.4 s; two batched, more
    assert max(results["unified-full"].tbt_s) > 0.3
    assert max(results["laneway"].tbt_s) < long_prefill_s
    assert max(results["laneway"].tbt_s) < max(results["unified-full"].tbt_s)


def test_cli_writes_the_documented_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seed.json"
    plot = tmp_path / "seed.png"
    argv = ["bench", "seed", "--gpus", "4", "--sessions", "12", "--long-requests", "2",
            "--long-tokens", "8192", "--duration", "4", "--seed", "3",
            "--json", str(out), "--plot", str(plot)]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "interactive TTFT P99 ms" in captured.out
    assert "seed: laneway" in captured.err  # progress goes to stderr
    document = json.loads(out.read_text())
    assert document["scenario"] == "seed"
    assert document["seed"] == 3
    assert set(document["configs"]) == set(CONFIG_NAMES)
    unified = document["configs"]["unified-full"]
    for numbers in document["configs"].values():
        assert set(numbers["interactive"]["ttft_ms"]) == {"p50", "p99", "max"}
        assert set(numbers["interactive"]["tbt_ms"]) == {"p50", "p99", "max"}
        assert isinstance(numbers["interactive"]["completed"], int)
        assert {"makespan_s", "throughput_tok_s", "completed"} <= set(numbers["batch"])
        assert numbers["batch"]["completed"] == 2
        assert 0 < numbers["gpu_busy"] <= 1
        assert 0 <= numbers["interactive"]["slo_attainment"] <= 1
        ratio = numbers["batch"]["makespan_s"] / unified["batch"]["makespan_s"]
        assert numbers["batch"]["makespan_vs_unified_full"] == pytest.approx(ratio, abs=1e-3)
    assert unified["batch"]["makespan_vs_unified_full"] == 1.0
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "1"], "--gpus must be at least 2"),
        (["--long-tokens", "200000"], "--long-tokens must be between"),
        (["--duration", "0"], "--duration must be above 0"),
        (["--configs", "split,fastest"], "unknown fastest"),
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
        (["--sessions", "0", "--long-requests", "0"], "nothing to run"),
        (["--sweep", "--mode", "live"], "--sweep runs in --mode virtual only"),
        (["--sweep", "--plot", "x.png"], "--sweep draws no plot"),
    ],
)
def test_cli_rejects_bad_flags_in_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "seed", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_cli_rejects_malformed_numbers_through_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "seed", "--gpus", "eight"])
    assert exited.value.code == 2
    assert "invalid int value: 'eight'" in capsys.readouterr().err


def test_slo_attainment_counts_turns_whose_ttft_and_every_gap_met_the_slo() -> None:
    from laneway.bench.seed.report import summarize

    quiet = dataclasses.replace(SMALL, long_requests=0)
    by_name = {c.name: c for c in seed_configs(quiet, H200)}
    calm = summarize(run_virtual(by_name["laneway"], H200, quiet), quiet)
    assert calm.slo_attainment == 1.0  # no long prompts: nothing stalls a chat turn

    burst = dataclasses.replace(SMALL, long_tokens=65536)  # 3.4 s whole prefills
    stalled = run_virtual(seed_configs(burst, H200)[0], H200, burst)  # unified-full
    summary = summarize(stalled, burst)
    # The whole 64k prefills freeze the streams already running on their replicas.
    stalled_gaps = sum(gap > 0.030 for gap in stalled.tbt_s)
    assert stalled_gaps > 0
    turns = stalled.interactive_completed + stalled.interactive_rejected
    assert summary.slo_attainment < 1
    # A turn misses for its own late first token or any of its gaps, never for more.
    late_first = sum(ttft > 0.300 for ttft in stalled.ttft_s)
    assert summary.slo_attainment >= 1 - (stalled_gaps + late_first) / turns


def test_sweep_cells_change_one_knob_at_a_time() -> None:
    from laneway.bench.seed.sweep import sweep_cells

    cells = sweep_cells(SeedScenario())
    assert [(c.knob, c.value) for c in cells] == [
        ("long_requests", 5), ("long_requests", 20), ("long_requests", 40),
        ("sessions", 100), ("sessions", 200), ("sessions", 300),
        ("long_tokens", 32768), ("long_tokens", 65536), ("long_tokens", 130560),
    ]  # fmt: skip
    for cell in cells:
        changed = {
            f.name
            for f in dataclasses.fields(SeedScenario)
            if getattr(cell.scenario, f.name) != getattr(SeedScenario(), f.name)
        }
        assert changed <= {cell.knob}


def test_cli_sweep_prints_each_cell_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.json"
    argv = ["bench", "seed", "--sweep", "--gpus", "2", "--duration", "2",
            "--configs", "unified-full,split", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "long_requests=40" in printed
    assert "long_tokens=130560" in printed
    document = json.loads(out.read_text())
    assert len(document["cells"]) == 9
    for cell in document["cells"]:
        split = cell["configs"]["split"]
        unified = cell["configs"]["unified-full"]
        assert split["batch"]["makespan_vs_split"] == 1.0
        assert unified["batch"]["makespan_vs_unified_full"] == 1.0
        assert isinstance(split["keeps_slo"], bool)


def test_lending_is_laneways_division_on_one_engine_with_the_days_lending() -> None:
    configs = {c.name: c for c in seed_configs(SeedScenario(), H200)}
    laneway, lending = configs["laneway"], configs["lending"]
    chat, batch = lending.pools
    assert (chat.replicas, batch.replicas) == tuple(p.replicas for p in laneway.pools)
    assert chat.engine == batch.engine == LENDING_ENGINE
    assert chat.lending == LendingSpec(borrower="batch", keep_replicas=1, headroom=0.25)
    assert (chat.max_context_tokens, batch.lane) == (LONG_CONTEXT, Lane.BATCH)
    # The operator's cross-pool rules hold: the lender's engine serves the batch prompts.
    assert check_pool_set(pools_of(lending)) == []
    assert lending.lends
    assert not laneway.lends


def test_the_lend_after_setting_reaches_the_ledger_and_the_live_gateway() -> None:
    base = next(c for c in seed_configs(SMALL, H200) if c.name == "lending")
    config = dataclasses.replace(base, pools=shared_engine_pools(SMALL.gpus, 2, LENDING))
    lent = {}
    for lend_after_s in (1.0, 60.0):
        cluster = VirtualCluster(
            config.pools, H200, config.picking, SeedWorkload(SMALL),
            duration_s=SMALL.duration_s, tie_break="t", scrape_interval_s=SCRAPE_INTERVAL_S,
            lend_after_s=lend_after_s,
        )  # fmt: skip
        cluster.run()
        lent[lend_after_s] = [c.url for _, c in cluster.role_changes if c.role is Role.LENT]
    assert lent[1.0]
    assert not lent[60.0]
    # Live, at half speed: the same timings in wall time.
    endpoints = {"realtime": ["a", "b"], "batch": ["c"]}
    documents = gateway_documents(dataclasses.replace(config, lend_after_s=2.5), endpoints, 0.5)
    assert documents[-1]["spec"]["lending"] == {"lendAfterMillis": 5000, "intervalMillis": 500}
    laneway = next(c for c in seed_configs(SMALL, H200) if c.name == "laneway")
    endpoints = {"realtime": ["a"], "batch": ["c"]}
    assert "lending" not in gateway_documents(laneway, endpoints, 0.5)[-1]["spec"]
