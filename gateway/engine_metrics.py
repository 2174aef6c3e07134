"""What an engine's /metrics says about its load, read from vLLM's or SGLang's metric names.

Pure: `parse_engine_metrics` turns Prometheus text into an `EngineMetrics`; the scrape loop
in `monitor.py` does the HTTP and keeps the time each sample was taken, so that stale samples
can be ignored instead of steering traffic by a picture that no longer holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Each gauge under its names in vLLM (current, then pre-V1) and SGLang.
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


@dataclass(frozen=True)
class EngineMetrics:
    waiting: float  # requests queued inside the engine
    running: float  # sequences in the running batch
    kv_usage: float  # fraction of KV cache blocks in use, 0-1


class EngineMetricsError(ValueError):
    """The text is not Prometheus exposition format or lacks the load gauges."""


def parse_engine_metrics(text: str) -> EngineMetrics:
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError as error:
        raise EngineMetricsError(f"not Prometheus text: {error}") from None

    def first(names: tuple[str, ...]) -> float:
        for name in names:
            if name in totals:
                return totals[name]
        raise EngineMetricsError(f"none of {', '.join(names)} in the engine's metrics")

    # Several model_name label values sum to the engine's load; usage is a fraction, so clamp.
    return EngineMetrics(
        waiting=first(WAITING),
        running=first(RUNNING),
        kv_usage=min(max(first(KV_USAGE), 0.0), 1.0),
    )
