"""One request's scoring cycle: the candidate endpoints, the data each scorer asked for, and
the filters that run before any scorer does.

A scorer declares the `DataKey`s it reads (`needs`); each key carries its own producer, a
function from the cycle to one value per candidate, run at most once per request and only
when something reads the key. A new scorer that needs new data defines its key (and
producer) in its own module: the ledger and the plan need no change. Producers read what
the ledger knows through `Facts`, the ledger's read-only face for one request.

The filter stage narrows the pool's endpoints before scoring: health (no ejected endpoint)
and a caller's subset (the endpoint picker passes Envoy's). Lane fit and tenant access are
settled per pool by `lanes.classify`, so every endpoint of the routed pool passes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route
from laneway.routing.slo import PRIOR, PrefillRate

T = TypeVar("T")


@dataclass(frozen=True)
class EndpointLoad:
    """What this gateway (and its peers) have on an endpoint now."""

    in_flight: int = 0  # requests sent and not finished
    prefill_tokens: int = 0  # prompt tokens sent whose first token has not come back

    def plus(self, other: EndpointLoad) -> EndpointLoad:
        return EndpointLoad(
            in_flight=self.in_flight + other.in_flight,
            prefill_tokens=self.prefill_tokens + other.prefill_tokens,
        )


class Facts(Protocol):
    """What the ledger knows of each endpoint at the moment of one request's plan."""

    def load(self, url: str) -> EndpointLoad: ...

    def engine(self, url: str) -> EngineMetrics | None:
        """The engine's scraped gauges; None when never scraped or stale."""

    def prefill_rate(self, url: str) -> PrefillRate | None:
        """The endpoint's learned rate; None before it has learned anything."""

    def cached_prompt_tokens(self, url: str) -> int | None:
        """Of this prompt, the tokens estimated in the endpoint's prefix cache; None when
        the prompt's prefix blocks were not looked up."""

    def healthy(self, url: str) -> bool: ...


@dataclass(frozen=True)
class CycleRequest:
    route: Route
    elapsed_ms: float = 0.0  # how long the request has been in the gateway already
    session_key: str | None = None  # x-laneway-session
    subset: frozenset[str] | None = None  # a caller's candidates; None: the whole pool


@dataclass(frozen=True, eq=False)
class DataKey(Generic[T]):
    """A datum per candidate endpoint, produced on first use in a cycle (compared by
    identity: two keys with one name are two data)."""

    name: str
    produce: Callable[[CycleState], Sequence[T]]


class CycleState:
    def __init__(self, request: CycleRequest, urls: Sequence[str], facts: Facts) -> None:
        self.request = request
        self.urls = tuple(urls)
        self.facts = facts
        self._data: dict[DataKey[Any], Sequence[Any]] = {}

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, key: DataKey[T]) -> Sequence[T]:
        data = self._data.get(key)
        if data is None:
            data = self._data[key] = key.produce(self)
        return cast("Sequence[T]", data)


# -- the filter stage ----------------------------------------------------------------------

# A filter keeps some of the candidates, in their order.
EndpointFilter = Callable[[CycleRequest, Facts, Sequence[str]], Sequence[str]]


def healthy(request: CycleRequest, facts: Facts, urls: Sequence[str]) -> Sequence[str]:
    return [url for url in urls if facts.healthy(url)]


def in_subset(request: CycleRequest, facts: Facts, urls: Sequence[str]) -> Sequence[str]:
    subset = request.subset
    return urls if subset is None else [url for url in urls if url in subset]


FILTERS: tuple[EndpointFilter, ...] = (healthy, in_subset)


def candidates(
    request: CycleRequest,
    endpoints: Sequence[str],
    facts: Facts,
    filters: Sequence[EndpointFilter] = FILTERS,
) -> CycleState:
    """The cycle over the endpoints every filter keeps, in the pool's order."""
    kept = endpoints
    for keep in filters:
        kept = keep(request, facts, kept)
    return CycleState(request, kept, facts)


# -- the data every plan and the built-in scorers read -----------------------------------


def _loads(cycle: CycleState) -> Sequence[EndpointLoad]:
    return [cycle.facts.load(url) for url in cycle.urls]


LOAD = DataKey("load", _loads)
IN_FLIGHT = DataKey("inFlight", lambda c: [load.in_flight for load in c[LOAD]])
PREFILL_TOKENS = DataKey("prefillTokens", lambda c: [load.prefill_tokens for load in c[LOAD]])
ENGINE = DataKey("engine", lambda c: [c.facts.engine(url) for url in c.urls])
# Reading this key is what makes a profile ask for the prompt's prefix blocks.
CACHED_PROMPT_TOKENS = DataKey(
    "cachedPromptTokens", lambda c: [c.facts.cached_prompt_tokens(url) for url in c.urls]
)
SESSION_KEY = DataKey("sessionKey", lambda c: [c.request.session_key] * len(c))
TTFT_SLO_MS = DataKey("ttftSloMs", lambda c: [c.request.route.pool.spec.slo.ttft_millis] * len(c))


def _own_prefill(cycle: CycleState) -> Sequence[int]:
    # What the prefix cache likely holds of this prompt needs no prefill there.
    tokens = cycle.request.route.prefill_tokens
    return [tokens - (cached or 0) for cached in cycle[CACHED_PROMPT_TOKENS]]


# Of this prompt, the tokens the endpoint computes: what the request adds to its backlog.
OWN_PREFILL = DataKey("ownPrefillTokens", _own_prefill)
# Prompt tokens the endpoint works through before this request's first token, its own
# included: what the TTFT prediction is made from, and what the first token teaches.
BACKLOG_TOKENS = DataKey(
    "backlogTokens",
    lambda c: [queued + own for queued, own in zip(c[PREFILL_TOKENS], c[OWN_PREFILL], strict=True)],
)


def _rates(cycle: CycleState) -> Sequence[PrefillRate]:
    """Each endpoint's rate; one that has learned nothing yet gets its pool peers' mean.

    The prior is deliberately slow, so an unproven replica predicts a late first token and
    the ttftSlo scorer steers work away from it, which is also what keeps it unproven: in a
    pool of two document replicas the first one used kept every new document. A replica of
    the same pool runs the same engine on the same GPU, so its peers' rate is the better guess.
    """
    own = [cycle.facts.prefill_rate(url) for url in cycle.urls]
    learned = [rate for rate in own if rate is not None and rate.samples]
    if not learned:
        return [rate or PRIOR for rate in own]
    mean = sum(r.ms_per_token for r in learned) / len(learned)
    peers = PrefillRate(ms_per_token=mean, samples=0)
    return [rate if rate is not None and rate.samples else peers for rate in own]


PREFILL_RATE = DataKey("prefillRate", _rates)
# This request's first token there, counted from its arrival.
PREDICTED_TTFT_MS = DataKey(
    "predictedTtftMs",
    lambda c: [
        c.request.elapsed_ms + rate.predict_ttft_ms(backlog)
        for rate, backlog in zip(c[PREFILL_RATE], c[BACKLOG_TOKENS], strict=True)
    ],
)
