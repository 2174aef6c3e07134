"""What the virtual-time runner (`runner.py`) holds per request and per replica: the
engine side and the workload's view, never the gateway's bookkeeping (the ledger's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from laneway.ledger import Ticket
from laneway.routing.lanes import Route
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.recompute import PrefillSpans
from laneway.simulator.seed import SimPool


@dataclass
class Request:
    request_id: str
    source: int  # the workload's own reference (its session, its arrival); -1 for none
    pool: int
    route: Route  # the gateway's decision, made once on arrival
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt_ids: Sequence[int] | None  # the prompt's token ids, if the workload has them
    session_key: str | None  # its x-laneway-session, if any
    ticket: Ticket  # its entry in the ledger
    # The `priority` the gateway sends its engine (`laneway.routing.priority`); None: none.
    engine_priority: int | None = None
    replica: int = -1  # -1 while it waits in the gateway's line
    first_token_s: float | None = None
    last_token_s: float | None = None
    max_gap_s: float = 0.0  # the longest wait between two of its tokens
    spans: PrefillSpans = field(default_factory=PrefillSpans)  # what its attempts prefilled


@dataclass
class Replica:
    url: str  # its name in its InferencePool's endpoints
    pool: int
    core: EngineCore
    started_s: float  # when it took its GPU
    ready: bool  # serving (a new replica is not until its cold start is over)
    draining: bool = False  # takes no new work; gives its GPU back when idle
    released_s: float | None = None
    stepping: StepOutcome | None = None
    aborting: set[str] = field(default_factory=set)  # request ids to abort after the step
    # Closed by the gateway and requeued already; the engine aborts them after the step.
    closed: set[str] = field(default_factory=set)
    busy_s: float = 0.0
    computed_prompt_tokens: int = 0  # prompt tokens its engine prefilled (cache hits not)


@dataclass
class PoolState:
    spec: SimPool
    replicas: list[int] = field(default_factory=list)  # indices of replicas holding a GPU
    named: int = 0  # replicas ever started, for their names
