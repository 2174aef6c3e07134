"""The pools the gateway routes to, their endpoints' health and scraped load.

Fed by any PoolSource through `update(pools)` with the complete current set: new pools
appear, changed ones take effect for the next request, and removed ones drain (requests
already admitted finish; those still waiting are refused).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool
from laneway.gateway.config import GatewaySettings
from laneway.gateway.pools.admission import PoolGate
from laneway.routing.engine_metrics import EngineMetrics, prefix_cache_reset
from laneway.routing.health import Health, after_failure, after_probe, after_success
from laneway.routing.slo import PRIOR, PrefillRate


@dataclass(frozen=True)
class Scrape:
    metrics: EngineMetrics
    taken_at: float  # the registry's clock


class PoolRegistry:
    def __init__(self, settings: GatewaySettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._pools: dict[str, InferencePool] = {}
        self._pool_list: tuple[InferencePool, ...] = ()  # the same, built once per update
        self._gates: dict[str, PoolGate] = {}
        self._health: dict[str, Health] = {}
        self._scrapes: dict[str, Scrape] = {}
        self._rates: dict[str, PrefillRate] = {}
        # Pool key -> its endpoints not ejected: rebuilt whenever a pool or a health changes,
        # read by every request.
        self._available: dict[str, tuple[str, ...]] = {}
        self.synced = False  # a source has delivered its first set

    def update(self, pools: Sequence[InferencePool]) -> None:
        incoming = {pool.key: pool for pool in pools}
        for key in self._pools.keys() - incoming.keys():
            self._gates.pop(key).close()
        for key in incoming.keys() - self._pools.keys():
            self._gates[key] = PoolGate(0, self._settings.queue.max_waiting)
        self._pools = incoming
        self._pool_list = tuple(incoming.values())
        urls = dict.fromkeys(url for pool in pools for url in pool.endpoints)
        self._health = {url: self._health.get(url, Health()) for url in urls}
        self._scrapes = {url: s for url, s in self._scrapes.items() if url in urls}
        self._rates = {url: r for url, r in self._rates.items() if url in urls}
        self.synced = True
        self._refresh_limits()

    def drain(self) -> None:
        """This replica is shutting down: requests still waiting for a slot are refused now,
        so their clients retry on another replica instead of waiting out the drain."""
        for gate in self._gates.values():
            gate.close("shutting_down")

    def pools(self) -> tuple[InferencePool, ...]:
        """The pools now configured: the same tuple until the next update."""
        return self._pool_list

    def gate(self, pool: InferencePool) -> PoolGate:
        return self._gates[pool.key]

    def current(self, pool: InferencePool) -> InferencePool | None:
        """The pool as now configured, None when it was removed since."""
        return self._pools.get(pool.key)

    def available(self, pool: InferencePool) -> tuple[str, ...]:
        if self._pools.get(pool.key) is pool:
            return self._available[pool.key]
        return self._not_ejected(pool)  # a pool changed or removed since the caller had it

    def _not_ejected(self, pool: InferencePool) -> tuple[str, ...]:
        return tuple(
            url for url in pool.endpoints if not (h := self._health.get(url)) or not h.ejected
        )

    def endpoints(self) -> list[str]:
        return list(self._health)

    def ejected(self) -> list[str]:
        return [url for url, health in self._health.items() if health.ejected]

    def ready(self) -> bool:
        return self.synced and any(self.available(pool) for pool in self._pools.values())

    def record_failure(self, url: str) -> bool:
        """Count a failed request; True when this failure ejected the endpoint."""
        before = self._health.get(url)
        if before is None:
            return False
        after = after_failure(before, self._settings.health.failures_to_eject)
        self._health[url] = after
        self._refresh_limits()
        return after.ejected and not before.ejected

    def record_success(self, url: str) -> None:
        health = self._health.get(url)
        if health is not None and health.failures:  # most are 0 already: nothing to build
            self._health[url] = after_success(health)

    def record_probe(self, url: str, passed: bool) -> None:
        if url in self._health:
            self._health[url] = after_probe(self._health[url], passed)
            self._refresh_limits()

    def record_scrape(self, url: str, metrics: EngineMetrics) -> bool:
        """Keep the sample; True when it shows the engine's prefix cache was reset."""
        previous = self._scrapes.get(url)
        reset = prefix_cache_reset(previous.metrics if previous else None, metrics)
        if url in self._health:
            self._scrapes[url] = Scrape(metrics, self._clock())
        return reset

    def record_first_token(self, url: str, backlog_tokens: int, ttft_ms: float) -> None:
        """A stream's first token came `ttft_ms` after it joined `backlog_tokens` there."""
        if url in self._health:
            self._rates[url] = self.prefill_rate(url).observed(backlog_tokens, ttft_ms)

    def prefill_rate(self, url: str) -> PrefillRate:
        return self._rates.get(url, PRIOR)

    @property
    def prefill_rates(self) -> Mapping[str, PrefillRate]:
        """Every endpoint's learned rate (absent: none learned yet), as the registry holds it."""
        return self._rates

    def fresh_metrics(self, url: str) -> EngineMetrics | None:
        scrape = self._scrapes.get(url)
        max_age = self._settings.scrape.stale_after_millis / 1000
        if scrape is None or self._clock() - scrape.taken_at > max_age:
            return None
        return scrape.metrics

    def _refresh_limits(self) -> None:
        # A pool admits maxConcurrentRequests per healthy replica; beyond that, requests
        # wait in the gateway's line, where interactive ones go first.
        self._available = {key: self._not_ejected(pool) for key, pool in self._pools.items()}
        for key, pool in self._pools.items():
            per_replica = pool.spec.limits.max_concurrent_requests
            self._gates[key].set_limit(per_replica * len(self._available[key]))
