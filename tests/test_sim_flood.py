"""The flood experiment in virtual time: the runner hands each request's tenant and caps to
the ledger, so a flooding tenant is held to its share of running requests and refused past
its queue, the other tenant is never refused, and a seed always gives the same run."""

from __future__ import annotations

from dataclasses import replace

from laneway.bench.demo.run import DEMO_POOLS
from laneway.routing.picker import PickingSettings
from laneway.simulator.flood_experiment import FloodResult, FloodScenario, run_flood_virtual
from laneway.simulator.profiles import PROFILES

H200 = PROFILES["h200-llama3-8b"]
SHORT = FloodScenario(duration_s=15.0, warmup_s=1.0, sessions=3, flood_share=3, flood_queue=4)


def run(scenario: FloodScenario) -> FloodResult:
    return run_flood_virtual(scenario, DEMO_POOLS[0], H200, PickingSettings())


def test_a_flood_is_held_to_its_share_and_its_queue_and_the_other_tenant_loses_nothing() -> None:
    flooded = run(replace(SHORT, flood_factor=10))
    # 30 senders against a share of 3 running and 4 waiting: the rest are refused, come
    # back after Retry-After, and are refused again while the share is full. Without its
    # caps the pool's 512 slots would run every sender at once.
    assert flooded.flood_peak_running == 3
    assert flooded.flood_refused > 0
    assert flooded.flood_ok > 0
    assert flooded.steady_refused == 0
    assert len(flooded.steady_ttft_s) > 10


def test_at_its_share_the_flood_is_never_refused_and_alone_the_steady_tenant_runs_alone() -> None:
    share = run(replace(SHORT, flood_factor=1))
    assert share.flood_peak_running == 3
    assert share.flood_refused == 0
    alone = run(replace(SHORT, flood_factor=0))
    assert (alone.flood_ok, alone.flood_refused, alone.flood_peak_running) == (0, 0, 0)
    assert alone.steady_refused == 0


def test_longer_flood_prompts_are_drawn_for_the_flood_tenant_only() -> None:
    plain = run(replace(SHORT, flood_factor=1))
    heavy = run(replace(SHORT, flood_factor=1, flood_prompt_tokens=(3000, 4000)))
    # The same share, heavier requests: fewer of the flood's finish in the same time.
    assert heavy.flood_ok < plain.flood_ok


def test_a_token_cap_holds_long_flood_prompts_to_one_at_a_time() -> None:
    long = replace(SHORT, flood_factor=10, flood_prompt_tokens=(2000, 4000))
    capped = run(replace(long, flood_max_prompt_tokens=3999))
    # Any two of its prompts weigh 4000 or more: one runs, however long, and the next waits.
    assert capped.flood_peak_running == 1
    assert run(long).flood_peak_running == 3  # its count cap alone lets three run
    assert 0 < capped.flood_prompt_tokens < run(long).flood_prompt_tokens
    assert capped.steady_refused == 0


def test_a_seed_gives_the_same_run() -> None:
    assert run(replace(SHORT, flood_factor=5)) == run(replace(SHORT, flood_factor=5))
    assert run(replace(SHORT, flood_factor=5)) != run(replace(SHORT, flood_factor=5, seed=1))
