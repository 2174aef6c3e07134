"""The engine's `/metrics`: vLLM's metric names, or SGLang's, over one set of measurements.

Gauges are read from the engine when Prometheus scrapes; counters and histograms are
updated as requests progress. Times are simulated seconds (wall time x time scale), so a
time-scaled engine reports what the real engine would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from laneway.api import MetricsFlavor

# vLLM's own histogram buckets (vllm/v1/metrics/loggers.py), so dashboards line up.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# Tokens per engine step (vllm/v1/metrics/buckets.py, ITERATION_TOKENS_BUCKETS).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(frozen=True)
class MetricNames:
    running: str
    waiting: str
    kv_usage: str  # fraction in [0, 1]
    prompt_tokens: str  # counters: prometheus-client appends `_total`
    generation_tokens: str
    finished_requests: str
    ttft: str
    inter_token: str
    e2e: str
    queue_time: str
    # Automatic prefix caching. vLLM: two counters in tokens (`vllm/v1/metrics/loggers.py`:
    # "Prefix cache queries, in terms of number of queried tokens", and the hits). SGLang:
    # one gauge, the hit rate of the latest prefill batch (`sglang/srt/metrics/collector.py`,
    # SchedulerMetricsCollector; set in the scheduler's `log_prefill_stats`).
    prefix_queries: str | None = None
    prefix_hits: str | None = None
    cache_hit_rate: str | None = None
    # vLLM's histogram of tokens per step (the steps that emit tokens: those tokens and the
    # prompts they complete; it does not show chunking). SGLang exports no such histogram.
    iteration_tokens: str | None = None


NAMES: dict[MetricsFlavor, MetricNames] = {
    MetricsFlavor.VLLM: MetricNames(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        prompt_tokens="vllm:prompt_tokens",
        generation_tokens="vllm:generation_tokens",
        finished_requests="vllm:request_success",
        ttft="vllm:time_to_first_token_seconds",
        inter_token="vllm:inter_token_latency_seconds",
        e2e="vllm:e2e_request_latency_seconds",
        queue_time="vllm:request_queue_time_seconds",
        prefix_queries="vllm:prefix_cache_queries",
        prefix_hits="vllm:prefix_cache_hits",
        iteration_tokens="vllm:iteration_tokens_total",
    ),
    MetricsFlavor.SGLANG: MetricNames(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
        prompt_tokens="sglang:prompt_tokens",
        generation_tokens="sglang:generation_tokens",
        finished_requests="sglang:num_requests",
        ttft="sglang:time_to_first_token_seconds",
        inter_token="sglang:inter_token_latency_seconds",
        e2e="sglang:e2e_request_latency_seconds",
        queue_time="sglang:queue_time_seconds",
        cache_hit_rate="sglang:cache_hit_rate",
    ),
}


# Not an engine metric: the simulated GPU time spent in steps, so a benchmark can report
# how busy the simulated GPUs were. The same name in both flavors.
# Ours, so no colon: Prometheus keeps colons for recording rules (the engines' own names,
# mirrored above, have them).
BUSY_SECONDS = "laneway_engine_busy_seconds"


@dataclass(frozen=True)
class EngineGauges:
    running: int
    waiting: int
    kv_usage: float
    busy_s: float  # simulated seconds spent in steps since start
    prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of those, the ones found cached
    last_batch_hit_rate: float = 0.0  # the latest admitting step's hit tokens / prompt tokens


class _GaugeCollector(Collector):
    def __init__(
        self, names: MetricNames, labels: dict[str, str], read: Callable[[], EngineGauges]
    ) -> None:
        self._names = names
        self._labels = labels
        self._read = read

    def collect(self) -> Iterator[Metric]:
        gauges = self._read()
        for name, documentation, value in (
            (self._names.running, "Requests running on the engine.", float(gauges.running)),
            (self._names.waiting, "Requests waiting to be scheduled.", float(gauges.waiting)),
            (self._names.kv_usage, "KV cache usage, 1 means full.", gauges.kv_usage),
        ):
            family = GaugeMetricFamily(name, documentation, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), value)
            yield family
        counters = [(BUSY_SECONDS, "Simulated GPU seconds spent in steps.", gauges.busy_s)]
        if self._names.prefix_queries and self._names.prefix_hits:
            counters += [
                (self._names.prefix_queries,
                 "Prefix cache queries, in terms of number of queried tokens.",
                 float(gauges.prefix_query_tokens)),
                (self._names.prefix_hits,
                 "Prefix cache hits, in terms of number of cached tokens.",
                 float(gauges.prefix_hit_tokens)),
            ]  # fmt: skip
        for name, documentation, value in counters:
            counter = CounterMetricFamily(name, documentation, labels=list(self._labels))
            counter.add_metric(list(self._labels.values()), value)
            yield counter
        if self._names.cache_hit_rate:
            rate = GaugeMetricFamily(
                self._names.cache_hit_rate, "The prefix cache hit rate.", labels=list(self._labels)
            )
            rate.add_metric(list(self._labels.values()), gauges.last_batch_hit_rate)
            yield rate


class SimulatorMetrics:
    """One engine's metrics in its own registry."""

    def __init__(
        self, flavor: MetricsFlavor, model_name: str, read_gauges: Callable[[], EngineGauges]
    ) -> None:
        names = NAMES[flavor]
        labels = {"model_name": model_name}
        if flavor == "vllm":
            labels["engine"] = "0"
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_GaugeCollector(names, labels, read_gauges))
        label_names = list(labels)

        def counter(name: str, documentation: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, documentation, [*label_names, *extra], registry=self.registry)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                name, documentation, label_names, buckets=buckets, registry=self.registry
            )

        self._labels = labels
        self._prompt_tokens = counter(names.prompt_tokens, "Prompt tokens processed.")
        self._generation_tokens = counter(names.generation_tokens, "Tokens generated.")
        self._finished = counter(
            names.finished_requests, "Requests finished.", ("finished_reason",)
        )
        self._ttft = histogram(names.ttft, "Time to first token.", TTFT_BUCKETS)
        self._inter_token = histogram(names.inter_token, "Time between tokens.", ITL_BUCKETS)
        self._e2e = histogram(names.e2e, "Request latency, arrival to last token.", REQUEST_BUCKETS)
        self._queue_time = histogram(
            names.queue_time, "Time waiting before scheduling.", REQUEST_BUCKETS
        )
        self._iteration_tokens = (
            histogram(
                names.iteration_tokens,
                "Histogram of number of tokens per engine_step.",
                ITERATION_TOKEN_BUCKETS,
            )
            if names.iteration_tokens
            else None
        )

    def stepped(self, tokens: int) -> None:
        """One engine step emitted tokens: `tokens` counts them and the prompts they end."""
        if self._iteration_tokens is not None:
            self._iteration_tokens.labels(**self._labels).observe(tokens)

    def admitted(self, queued_s: float) -> None:
        self._queue_time.labels(**self._labels).observe(queued_s)

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        self._prompt_tokens.labels(**self._labels).inc(prompt_tokens)
        self._generation_tokens.labels(**self._labels).inc()
        self._ttft.labels(**self._labels).observe(ttft_s)

    def next_token(self, gap_s: float) -> None:
        self._generation_tokens.labels(**self._labels).inc()
        self._inter_token.labels(**self._labels).observe(gap_s)

    def finished(self, reason: str, e2e_s: float) -> None:
        self._finished.labels(**self._labels, finished_reason=reason).inc()
        self._e2e.labels(**self._labels).observe(e2e_s)
