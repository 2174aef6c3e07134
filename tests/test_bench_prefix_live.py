"""`laneway bench prefix --mode live` in small: real engines and gateway, each picker's config."""

from __future__ import annotations

from laneway.bench.prefix.live import gateway_documents, run_live_picker
from laneway.gateway.config import parse_documents
from laneway.routing.picker import PickingSettings
from laneway.simulator.prefix_experiment import PickerName, PrefixScenario, picker_settings
from laneway.simulator.profiles import PROFILES

TINY = PrefixScenario(
    interactive_replicas=2, batch_replicas=1, chat_sessions=3, document_sessions=1,
    document_tokens=2048, questions=2, duration_s=4.0,
)  # fmt: skip


def test_each_picker_is_a_gateway_configuration_the_gateway_accepts() -> None:
    defaults = PickingSettings()
    endpoints = {"chat": ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                 "documents": ["http://127.0.0.1:3"]}  # fmt: skip
    cases: list[tuple[PickerName, dict[str, int]]] = [
        ("none", {**defaults.weights, "prefixAffinity": 0}),
        ("laneway", dict(defaults.weights)),
        ("sticky", {**dict.fromkeys(defaults.weights, 0), "sessionHash": 1}),
    ]
    for picker, expected in cases:
        settings = picker_settings(picker, defaults)
        assert dict(settings.weights) == expected, picker
        loaded = parse_documents(gateway_documents(TINY, settings, endpoints), picker)
        assert loaded.settings.picking == settings, picker
        assert [p.name for p in loaded.pools] == ["chat", "documents"]


async def test_a_live_run_serves_every_session_and_hits_the_shared_prefixes() -> None:
    result = await run_live_picker(
        TINY, PROFILES["h200-llama3-8b"], "laneway", PickingSettings(), time_scale=2.0
    )
    assert result.requests >= 4
    assert len(result.ttft_s) >= 3  # every chat session's first turn at least
    # Later turns resend their system prompt and history: the engines find them cached.
    assert 0 < result.hit_rate < 1
    assert result.prefill_tokens > 0
    assert result.load_imbalance >= 1
