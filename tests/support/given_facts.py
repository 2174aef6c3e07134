"""What the routing library's tests plan over: `GivenFacts`, the ledger's read-only face
(`laneway.routing.cycle.Facts`) holding the values a test gives, and the cycle a pool's
endpoints make over them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from laneway.routing.cycle import CycleRequest, CycleState, EndpointLoad, candidates
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route
from laneway.routing.slo import PrefillRate


@dataclasses.dataclass
class GivenFacts:
    loads: dict[str, EndpointLoad] = dataclasses.field(default_factory=dict)
    gauges: dict[str, EngineMetrics] = dataclasses.field(default_factory=dict)
    rates: dict[str, PrefillRate] = dataclasses.field(default_factory=dict)
    cached: dict[str, int] | None = None  # None: the prompt's blocks were not looked up
    ejected: frozenset[str] = frozenset()
    reads: list[str] = dataclasses.field(default_factory=list)  # loads and gauges read

    def load(self, url: str) -> EndpointLoad:
        self.reads.append(f"load {url}")
        return self.loads.get(url, EndpointLoad())

    def engine(self, url: str) -> EngineMetrics | None:
        self.reads.append(f"engine {url}")
        return self.gauges.get(url)

    def prefill_rate(self, url: str) -> PrefillRate | None:
        return self.rates.get(url)

    def cached_prompt_tokens(self, url: str) -> int | None:
        return None if self.cached is None else self.cached.get(url, 0)

    def healthy(self, url: str) -> bool:
        return url not in self.ejected


def cycle_over(
    route: Route,
    urls: Sequence[str],
    facts: GivenFacts,
    *,
    elapsed_ms: float = 0.0,
    session_key: str | None = None,
) -> CycleState:
    """The cycle of one request on `route` over `urls`, through the filter stage."""
    request = CycleRequest(route=route, elapsed_ms=elapsed_ms, session_key=session_key)
    return candidates(request, urls, facts)
