"""The pools and their endpoints: health (eject after failures, re-admit on a probe), the
engines' scraped gauges and when they were taken, and each endpoint's learned prefill rate.

Pools come from `update` with the complete current set; an endpoint's state lives while
some pool lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool
from laneway.routing.engine_metrics import EngineMetrics, prefix_cache_reset
from laneway.routing.health import Health, after_failure, after_probe, after_success
from laneway.routing.slo import PRIOR, PrefillRate


@dataclass(frozen=True)
class Scrape:
    metrics: EngineMetrics
    taken_at: float


class EndpointBook:
    def __init__(self, failures_to_eject: int, stale_after_s: float) -> None:
        self._failures_to_eject = failures_to_eject
        self._stale_after_s = stale_after_s
        self.pools: dict[str, InferencePool] = {}
        self.pool_list: tuple[InferencePool, ...] = ()  # the same, built once per update
        self._health: dict[str, Health] = {}
        self._scrapes: dict[str, Scrape] = {}
        self._rates: dict[str, PrefillRate] = {}
        # Pool key -> its endpoints not ejected: rebuilt whenever a pool or a health changes.
        self._available: dict[str, tuple[str, ...]] = {}

    def update(self, pools: Sequence[InferencePool], listed: Iterable[InferencePool]) -> None:
        """`pools` as the routing sees them (`lending.py` moves replicas between pools);
        `listed` as delivered: every endpoint there keeps its health, gauges and rate (a
        draining replica, in none of `pools`, too)."""
        self.pools = {pool.key: pool for pool in pools}
        self.pool_list = tuple(self.pools.values())
        urls = dict.fromkeys(url for pool in listed for url in pool.endpoints)
        self._health = {url: self._health.get(url, Health()) for url in urls}
        self._scrapes = {url: s for url, s in self._scrapes.items() if url in urls}
        self._rates = {url: r for url, r in self._rates.items() if url in urls}
        self._refresh()

    def available(self, pool: InferencePool) -> tuple[str, ...]:
        """The pool's endpoints not ejected, as the pool is configured now where it still is."""
        if self.pools.get(pool.key) is pool:
            return self._available[pool.key]
        return self._not_ejected(pool)

    def available_of(self, key: str) -> tuple[str, ...]:
        return self._available.get(key, ())

    def endpoints(self) -> list[str]:
        return list(self._health)

    def ejected(self) -> list[str]:
        return [url for url, health in self._health.items() if health.ejected]

    def healthy(self, url: str) -> bool:
        """Not ejected (an endpoint no pool lists has no record, and counts as healthy)."""
        health = self._health.get(url)
        return health is None or not health.ejected

    def failure(self, url: str) -> bool:
        """Count a failure; True when this one ejected the endpoint."""
        before = self._health.get(url)
        if before is None:
            return False
        after = after_failure(before, self._failures_to_eject)
        self._health[url] = after
        if after.ejected != before.ejected:
            self._refresh()
        return after.ejected and not before.ejected

    def success(self, url: str) -> None:
        health = self._health.get(url)
        if health is not None and health.failures:  # most are 0 already: nothing to build
            self._health[url] = after_success(health)

    def probe(self, url: str, passed: bool) -> None:
        if url in self._health:
            self._health[url] = after_probe(self._health[url], passed)
            self._refresh()

    def scrape(self, url: str, now: float, metrics: EngineMetrics) -> bool:
        """Keep the sample; True when it shows the engine's prefix cache was reset."""
        previous = self._scrapes.get(url)
        reset = prefix_cache_reset(previous.metrics if previous else None, metrics)
        if url in self._health:
            self._scrapes[url] = Scrape(metrics, now)
        return reset

    def fresh_metrics(self, url: str, now: float) -> EngineMetrics | None:
        scrape = self._scrapes.get(url)
        if scrape is None or now - scrape.taken_at > self._stale_after_s:
            return None
        return scrape.metrics

    def first_token(self, url: str, backlog_tokens: int, ttft_ms: float) -> None:
        if url in self._health:
            self._rates[url] = self.prefill_rate(url).observed(backlog_tokens, ttft_ms)

    def prefill_rate(self, url: str) -> PrefillRate:
        return self._rates.get(url, PRIOR)

    @property
    def prefill_rates(self) -> Mapping[str, PrefillRate]:
        """Every endpoint's learned rate (absent: none learned yet)."""
        return self._rates

    def _not_ejected(self, pool: InferencePool) -> tuple[str, ...]:
        return tuple(url for url in pool.endpoints if self.healthy(url))

    def _refresh(self) -> None:
        self._available = {key: self._not_ejected(pool) for key, pool in self.pools.items()}
