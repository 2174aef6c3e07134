"""The request ledger: pure state of requests and endpoints, changed in one place, for
every shell (the gateway, the virtual-time runner) to drive. See `ledger.py`."""

from __future__ import annotations

from laneway.ledger.decisions import (
    NO_BLOCKS,
    NO_WAKES,
    Admission,
    AdmitDecision,
    Admitted,
    Failed,
    Finished,
    FirstToken,
    LedgerSettings,
    PromptBlocks,
    Queued,
    Rebalanced,
    Refused,
    Scraped,
    Sent,
    Wakes,
    Withdrawn,
)
from laneway.ledger.ledger import Ledger
from laneway.ledger.lending import PeerLending, Reclaim, Role, RoleChange
from laneway.ledger.lines import GateState, Ticket
from laneway.ledger.log import RequestLog
from laneway.ledger.responses import StoredResponse
from laneway.routing.cycle import EndpointLoad

__all__ = [
    "NO_BLOCKS",
    "NO_WAKES",
    "Admission",
    "AdmitDecision",
    "Admitted",
    "EndpointLoad",
    "Failed",
    "Finished",
    "FirstToken",
    "GateState",
    "Ledger",
    "LedgerSettings",
    "PeerLending",
    "PromptBlocks",
    "Queued",
    "Rebalanced",
    "Reclaim",
    "Refused",
    "RequestLog",
    "Role",
    "RoleChange",
    "Scraped",
    "Sent",
    "StoredResponse",
    "Ticket",
    "Wakes",
    "Withdrawn",
]
