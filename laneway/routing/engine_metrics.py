"""What an engine's /metrics says about its load, read from vLLM's or SGLang's metric names.

Pure: `parse_engine_metrics` turns Prometheus text into an `EngineMetrics`; the gateway's
scrape loop (`gateway/pools/scrape.py`) does the HTTP and keeps the time each sample was
taken, so that stale samples can be ignored instead of steering traffic by a picture that no
longer holds.
"""

from __future__ import annotations

from dataclasses import dataclass

# Each gauge under its names in vLLM (current, then pre-V1) and SGLang.
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
# vLLM's prefix-cache query counter (tokens), current then pre-V1 name. It only grows while
# the engine lives, so a drop means a restart with an empty cache. SGLang exports a hit-rate
# gauge instead, which says nothing about restarts.
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")


@dataclass(frozen=True)
class EngineMetrics:
    waiting: float  # requests queued inside the engine
    running: float  # sequences in the running batch
    kv_usage: float  # fraction of KV cache blocks in use, 0-1
    prefix_queries: float | None = None  # the prefix-cache query counter; None: not exported


class EngineMetricsError(ValueError):
    """The text is not Prometheus exposition format or lacks the load gauges."""


def parse_engine_metrics(text: str) -> EngineMetrics:
    totals = _wanted_samples(text)

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
        prefix_queries=next((totals[n] for n in PREFIX_QUERIES if n in totals), None),
    )


def prefix_cache_reset(previous: EngineMetrics | None, current: EngineMetrics) -> bool:
    """True when the engine's prefix-cache counter went backwards: it restarted, and its
    cache is empty whatever the gateway routed there before."""
    if previous is None or previous.prefix_queries is None or current.prefix_queries is None:
        return False
    return current.prefix_queries < previous.prefix_queries


def _wanted_samples(text: str) -> dict[str, float]:
    """Sum the samples of the gauges above, skipping every other line unparsed.

    An engine's /metrics is mostly histograms; a full Prometheus parse of it takes tens of
    milliseconds of the event loop per scrape, where this scan of line heads takes about one.
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        brace = line.find("{")
        name = line[:brace] if brace != -1 else line.split(" ", 1)[0]
        if name not in _WANTED:
            continue
        rest = line[line.rfind("}") + 1 :] if brace != -1 else line[len(name) :]
        fields = rest.split()  # value, then an optional timestamp
        try:
            totals[name] = totals.get(name, 0.0) + float(fields[0])
        except (IndexError, ValueError):
            raise EngineMetricsError(f"not Prometheus text: cannot read {line!r}") from None
    return totals


_WANTED = frozenset(WAITING + RUNNING + KV_USAGE + PREFIX_QUERIES)
_PREFIXES = tuple({name.split(":", 1)[0] + ":" for name in _WANTED})
