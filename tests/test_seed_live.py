"""`laneway bench seed --mode live --quick`: real engines, the real gateway, the load generator.

Structure and invariants only (every request accounted for, the batch completes, lanes
respected); never timings. And no child process outlives the run, however it ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.marks import HANG_S, assert_all_gone, wait_for_children

from laneway.simulator.profiles import PROFILES
from laneway.simulator.seed import CONFIG_NAMES, SeedScenario, seed_configs

BENCH = [sys.executable, "-m", "laneway.cli", "bench", "seed", "--mode", "live", "--quick"]


def test_quick_live_run_accounts_for_every_request(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    result = subprocess.run(
        [*BENCH, "--json", str(out)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "live vs virtual" in result.stdout
    assert result.stdout.count("client, gateway's buckets") == len(CONFIG_NAMES)
    document = json.loads(out.read_text())
    assert document["mode"] == "live"
    assert set(document["configs"]) == set(CONFIG_NAMES)
    assert set(document["virtual"]["configs"]) == set(CONFIG_NAMES)
    long_requests = document["parameters"]["long_requests"]
    for name, numbers in document["configs"].items():
        requests = numbers["requests"]
        assert requests["issued"] == requests["accounted_for"], name
        assert requests["failed"] == {}, name
        assert numbers["batch"]["completed"] == long_requests, name
        assert numbers["interactive"]["completed"] > 0, name
        if name.startswith("unified"):
            # One pool takes everything.
            assert requests["long_lanes"] == {"interactive": long_requests}, name
        else:
            assert requests["long_lanes"] == {"batch": long_requests}, name
            assert set(requests["interactive_lanes"]) == {"interactive"}, name
        assert set(document["difference_pct"][name]) >= {"ttft_p99", "tbt_p99", "batch_makespan_s"}
        # The gateway timed the streams the client timed (warm-up requests left out).
        timed = numbers["gateway_ttft"]["streams"]
        assert timed["gateway"] == timed["client"] > 0, name


@pytest.mark.slow
def test_through_envoy_and_the_picker_the_seed_takes_the_gateways_lanes(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    fronts = ["--fronts", "gateway,envoy+laneway", "--configs", "laneway"]
    result = subprocess.run(
        [*BENCH, *fronts, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== through envoy+laneway" in result.stdout
    assert "lanes and SLO verdicts by front" in result.stdout
    document = json.loads(out.read_text())
    long_requests = document["parameters"]["long_requests"]
    runs = [document["configs"]["laneway"], document["fronts"]["envoy+laneway"]["laneway"]]
    for numbers in runs:
        requests = numbers["requests"]
        assert requests["issued"] == requests["accounted_for"]
        assert requests["failed"] == {}
        # The picker classified as the gateway does: the long prompts to the batch lane.
        assert requests["long_lanes"] == {"batch": long_requests}
        assert set(requests["interactive_lanes"]) == {"interactive"}
        timed = numbers["gateway_ttft"]["streams"]
        assert timed["gateway"] == timed["client"] > 0
    rows = document["fronts_compared"]
    assert sorted(row["front"] for row in rows) == ["envoy+laneway", "gateway"]


def test_a_crashed_engine_ends_the_run_and_every_child(tmp_path: Path) -> None:
    with subprocess.Popen(
        [*BENCH, "--configs", "split"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as bench:
        try:
            children = wait_for_children(bench, 5)  # 4 engines and the gateway
            victim = children[0]
            os.kill(victim, signal.SIGKILL)
            _, err = bench.communicate(timeout=HANG_S)
        finally:
            bench.kill()
    assert bench.returncode == 1
    assert "a child process failed" in err
    assert "Traceback" not in err
    assert_all_gone(children)


def test_ctrl_c_stops_every_child() -> None:
    with subprocess.Popen(
        [*BENCH, "--configs", "laneway"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as bench:
        try:
            children = wait_for_children(bench, 5)
            bench.send_signal(signal.SIGINT)
            _, err = bench.communicate(timeout=HANG_S)
        finally:
            bench.kill()
    assert bench.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert_all_gone(children)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--time-scale", "0"], "--time-scale must be above 0"),
        (["--mode", "virtual", "--time-scale", "2"], "--time-scale applies to --mode live only"),
        (
            ["--fronts", "gateway,nginx"],
            "--fronts: unknown nginx; choose from gateway, envoy+laneway",
        ),
        (
            ["--mode", "virtual", "--fronts", "envoy+laneway"],
            "--fronts applies to --mode live only",
        ),
    ],
)
def test_live_flags_are_checked(flags: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laneway.cli", "bench", "seed", "--mode", "live", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_every_configuration_is_a_valid_gateway_config() -> None:
    """The documents live mode writes parse as the gateway parses its --config file."""
    from laneway.bench.seed.live import gateway_documents
    from laneway.gateway.config import parse_documents
    from laneway.simulator.profiles import PROFILES
    from laneway.simulator.seed import PUBLIC_MODEL, SeedScenario, seed_configs

    for config in seed_configs(SeedScenario(), PROFILES["h200-llama3-8b"]):
        endpoints = {
            pool.name: [f"http://127.0.0.1:{9000 + i}" for i in range(pool.replicas)]
            for pool in config.pools
        }
        parsed = parse_documents(gateway_documents(config, endpoints, 0.5), config.name)
        # The live gateway routes over the very pools and picking profile the virtual
        # runner routes over.
        assert parsed.settings.picking == config.picking
        assert list(parsed.pools) == [
            pool.inference_pool(endpoints[pool.name]) for pool in config.pools
        ]
        for pool, spec in zip(config.pools, parsed.pools, strict=True):
            assert PUBLIC_MODEL in spec.spec.routing.models
            assert spec.spec.served_model_name == pool.served_model
            assert spec.spec.limits.max_context_tokens == pool.max_context_tokens
            assert list(spec.endpoints) == endpoints[pool.name]


def test_live_slo_attainment_counts_turns_whose_ttft_and_every_gap_met_the_slo() -> None:
    from laneway.bench.harness.loadgen import RequestRecord
    from laneway.bench.seed.live import result_from_records

    def turn(ttft_s: float, gaps_s: tuple[float, ...], status: int = 200) -> RequestRecord:
        return RequestRecord(
            "interactive", 0, 1.0, 500, 4, status, "interactive", "realtime", 500,
            len(gaps_s) + 1, ttft_s, gaps_s, 1.0,
        )  # fmt: skip

    scenario = SeedScenario()
    config = seed_configs(scenario, PROFILES["h200-llama3-8b"])[2]
    records = [
        turn(0.050, (0.010, 0.020)),  # within
        turn(0.300, (0.030,)),  # on both limits: within
        turn(0.301, (0.010,)),  # a late first token
        turn(0.050, (0.010, 0.031)),  # one late gap
        turn(0.050, (), status=400),  # refused
    ]
    result = result_from_records(config, scenario, records, 1.0, 10.0)
    assert result.interactive_within_slo == 2
