"""What the ledger is asked and what it answers: frozen data, one type per step of a
request's life. The shell acts on the answers (wakes a waiter, tries an endpoint, writes a
log line) and changes no state of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from laneway.ledger.lending import Reclaim, RoleChange
from laneway.ledger.lines import GateState, Ticket
from laneway.ledger.log import RequestLog
from laneway.routing.fairshare import NO_CAPS, TenantCaps
from laneway.routing.kv_events import cached_tokens
from laneway.routing.lanes import Route
from laneway.routing.picker import PickingSettings
from laneway.routing.plan import PlannedEndpoint
from laneway.routing.prefix_index import estimated_cached_tokens


@dataclass(frozen=True)
class LedgerSettings:
    picking: PickingSettings = field(default_factory=PickingSettings)
    max_waiting: int = 1024  # per pool line; beyond it a request is refused at once
    failures_to_eject: int = 3  # consecutive upstream failures before an endpoint is ejected
    stale_after_s: float = 5.0  # older scraped gauges are not scored
    slo_window_s: float = 300.0  # TTFT-SLO attainment over this long (demand)
    max_attempts: int = 2  # the first pick, and one retry on the next endpoint
    # Stored responses (responses.py): OpenAI keeps them 30 days; vLLM's store, for its
    # process's life, so an entry also ends with its endpoint's engine.
    response_ttl_s: float = 30 * 24 * 3600.0
    response_capacity: int = 100_000  # ids remembered, the least recently made dropped first
    # Batch pools fed per replica (`feeding.py`); False: one pool-wide count of
    # maxConcurrentRequests per endpoint, as for the interactive lane.
    feed_batch_per_replica: bool = True
    # A fed replica whose engine's KV usage gauge reads this or more takes no new document.
    feed_kv_limit: float = 0.9
    # A lending pool lends one more replica per this long of chat demand below its
    # replicas (`lending.py`): a lull between two turns lends nothing.
    lend_after_s: float = 5.0
    # False: a lent replica does not join its borrower's endpoints here, for a shell that
    # cannot end the borrower's requests there when the replica is taken back (the endpoint
    # picker: Envoy holds them).
    borrow_lent: bool = True


@dataclass(frozen=True)
class Admission:
    """A routed request asking for a slot in its pool: what its log and its place in line
    need. `arrived` is when its first bytes were read, on the clock every `now` uses."""

    route: Route
    arrived: float
    path: str
    model: str
    stream: bool = False
    tenant: str = ""  # places the request in the fair-share order, and counts against caps
    fair_tokens: int = 0  # the tokens the fair share charges it (sequences x prompt)
    caps: TenantCaps = NO_CAPS  # the tenant's caps in each pool
    session_key: str | None = None  # x-laneway-session


@dataclass(frozen=True)
class Admitted:
    ticket: Ticket
    queue_ms: float  # 0 for a slot taken at once


@dataclass(frozen=True)
class Refused:
    ticket: Ticket
    # "queue_full", "pool_removed", "shutting_down", "all_ejected" (before joining: every
    # endpoint of the pool is ejected), "tenant_queue_full" (its tenant's cap of waiting
    # requests), "line_share" (it gave its place in a full line to another tenant's
    # request, its tenant holding more than an equal share) or "timeout" (withdrawn by the
    # shell)
    reason: str
    gate: GateState


@dataclass(frozen=True)
class Wakes:
    """The queued tickets a change admitted or refused: the shell wakes each one."""

    granted: tuple[Admitted, ...] = ()
    refused: tuple[Refused, ...] = ()

    def __add__(self, other: Wakes) -> Wakes:
        return Wakes(granted=self.granted + other.granted, refused=self.refused + other.refused)

    def __bool__(self) -> bool:
        return bool(self.granted or self.refused)


NO_WAKES = Wakes()


@dataclass(frozen=True)
class Queued:
    """In line; a later answer's `Wakes` admits or refuses it."""

    ticket: Ticket
    wakes: Wakes = NO_WAKES  # the ticket whose place in a full line it took, refused


AdmitDecision = Admitted | Queued | Refused


@dataclass(frozen=True)
class Withdrawn:
    refused: Refused
    wakes: Wakes  # a slot granted in the same tick as the withdrawal, handed on


@dataclass(frozen=True)
class PromptBlocks:
    """The prompt's prefix blocks as the prefix index keys them."""

    hashes: tuple[int, ...] = ()  # empty when the profile scores no prefix
    # The engines' block size where their KV events feed the index (exact: token-id blocks
    # that routing never records); None where the index is an estimate of what was routed.
    exact_block_size: int | None = None

    def cached_tokens(self, matched: int, prompt_tokens: int) -> int | None:
        if not self.hashes:
            return None
        if self.exact_block_size is not None:
            return cached_tokens(matched, self.exact_block_size, prompt_tokens)
        return estimated_cached_tokens(matched, len(self.hashes), prompt_tokens)


NO_BLOCKS = PromptBlocks()


@dataclass(frozen=True)
class Sent:
    endpoint: PlannedEndpoint
    attempt: int  # 1 for the first
    own_s: float  # the gateway's time before sending: since arrival, less the queue wait


@dataclass(frozen=True)
class FirstToken:
    ttft_ms: float  # from arrival to the first token written to the client
    met_slo: bool  # within the pool's slo.ttftMillis
    # The tickets a replica's free prefill admitted (a pool fed per replica); empty on
    # every later call for the same attempt.
    wakes: Wakes = NO_WAKES
    # The first chat token on a replica taken back from lending since it was: from the
    # decision to take it back to this token (`Ledger.rebalance`).
    reclaim_ms: float | None = None


@dataclass(frozen=True)
class Scraped:
    reset: bool  # the engine's prefix cache was reset (it restarted)
    wakes: Wakes  # the tickets its KV room admitted (a pool fed per replica)


@dataclass(frozen=True)
class Failed:
    endpoint: str
    ejected: bool  # this failure ejected the endpoint
    # The next endpoint of the plan, while attempts remain: a request whose client has
    # seen nothing yet may go there.
    retry: PlannedEndpoint | None


@dataclass(frozen=True)
class Finished:
    log: RequestLog
    wakes: Wakes  # the tickets its slot admitted


@dataclass(frozen=True)
class Rebalanced:
    """The lending pools' role changes of one moment, what to abort, whom they admit."""

    changes: tuple[RoleChange, ...] = ()
    reclaims: tuple[Reclaim, ...] = ()
    wakes: Wakes = NO_WAKES
