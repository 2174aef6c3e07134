"""Cost model sanity: monotonic, never faster than the hardware, and near published figures."""

from __future__ import annotations

import itertools

import pytest

from laneway.simulator.cost import (
    PrefillChunk,
    StepWork,
    roofline_floor_s,
    step_cost,
    step_duration,
)
from laneway.simulator.profiles import LLAMA3_8B, PROFILES, Profile

REAL_PROFILES = [PROFILES["h200-llama3-8b"], PROFILES["h100-llama3-8b"]]


def prefill(tokens: int, context_before: int = 0) -> StepWork:
    chunk = PrefillChunk(tokens=tokens, context_before=context_before, completes_prompt=True)
    return StepWork(prefill=(chunk,))


def decode(batch: int, context: int) -> StepWork:
    return StepWork(decode_count=batch, decode_context_tokens=batch * context)


def test_llama3_8b_shape_gives_its_known_size() -> None:
    # Llama-3-8B has 8.03 B parameters: 16.06 GB in bf16; 128 KiB of KV per token.
    assert 16.0e9 < LLAMA3_8B.weight_bytes < 16.1e9
    assert LLAMA3_8B.kv_bytes_per_token == 131072


@pytest.mark.parametrize("profile", REAL_PROFILES, ids=lambda p: p.name)
def test_monotonic_in_tokens_batch_and_context(profile: Profile) -> None:
    prefill_times = [step_duration(profile, prefill(n)) for n in (1, 64, 512, 2048, 8192, 65536)]
    assert prefill_times == sorted(prefill_times)
    # 1 and 64 tokens are bound by reading the weights: nearly the same time.
    assert prefill_times[1] < prefill_times[0] * 1.01
    assert all(a < b for a, b in itertools.pairwise(prefill_times[1:]))
    decode_times = [step_duration(profile, decode(b, 1000)) for b in (1, 8, 64, 256)]
    assert decode_times == sorted(decode_times)
    assert decode_times[0] < decode_times[-1]
    context_times = [step_duration(profile, prefill(1024, c)) for c in (0, 4096, 32768, 131072)]
    assert context_times == sorted(context_times)
    assert context_times[0] < context_times[-1]


@pytest.mark.parametrize("profile", REAL_PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize(
    "work",
    [
        decode(1, 100),
        decode(256, 4000),
        prefill(1),
        prefill(2048),
        prefill(65536),
        prefill(1024, 60000),
        StepWork(
            prefill=(PrefillChunk(tokens=1024, context_before=30000, completes_prompt=False),),
            decode_count=50,
            decode_context_tokens=50 * 900,
        ),
    ],
)
def test_never_faster_than_the_roofline(profile: Profile, work: StepWork) -> None:
    assert step_duration(profile, work) >= roofline_floor_s(profile, work) > 0


def test_adding_decodes_to_a_prefill_costs_less_than_a_separate_step() -> None:
    """Piggybacking: decodes share the weight reads of the prefill chunk's step."""
    profile = PROFILES["h200-llama3-8b"]
    chunk = PrefillChunk(tokens=1024, context_before=0, completes_prompt=True)
    work = StepWork(prefill=(chunk,), decode_count=50, decode_context_tokens=50 * 1000)
    together = step_duration(profile, work)
    apart = step_duration(profile, prefill(1024)) + step_duration(profile, decode(50, 1000))
    assert together < apart


def test_empty_steps_and_the_zero_profile_take_no_time() -> None:
    assert step_duration(PROFILES["h200-llama3-8b"], StepWork()) == 0.0
    assert step_duration(PROFILES["zero"], prefill(65536)) == 0.0
    assert step_cost(PROFILES["zero"], decode(100, 1000)).total_s == 0.0


def test_h200_decodes_faster_than_h100_and_prefills_the_same() -> None:
    h100, h200 = PROFILES["h100-llama3-8b"], PROFILES["h200-llama3-8b"]
    assert step_duration(h200, decode(32, 2000)) < step_duration(h100, decode(32, 2000))
    assert step_duration(h200, prefill(8192)) == pytest.approx(step_duration(h100, prefill(8192)))


def test_predictions_sit_within_the_published_measurements() -> None:
    """docs/SIMULATOR.md cites each figure; these bands are the measurements' own ranges."""
    h100 = PROFILES["h100-llama3-8b"]
    # The seed article: a 64k-token prompt prefilled whole holds the GPU for 3-5 s.
    assert 3.0 < step_duration(h100, prefill(65536)) < 5.0
    # vLLM's V1 blog: a Llama-8B decode step on an H100 executes in about 5 ms on the GPU,
    # plus CPU overhead; the weights alone need 4.8 ms at the datasheet's full bandwidth.
    assert 5.0e-3 < step_duration(h100, decode(1, 500)) < 8.0e-3
