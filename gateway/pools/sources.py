"""Where the gateway's pools come from: a YAML file or the Kubernetes API, one code path after.

A source calls `update` with the complete current set of pools (endpoints filled in) each
time it learns something new; the gateway's ledger diffs that set against what it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from laneway.api import InferencePool

PoolUpdate = Callable[[Sequence[InferencePool]], None]


class PoolSource(Protocol):
    async def run(self, update: PoolUpdate) -> None:
        """Feed `update` until cancelled; a static source may call it once and return."""


class StaticPoolSource:
    """Pools known up front (the YAML file of local mode): one update, then nothing."""

    def __init__(self, pools: Sequence[InferencePool]) -> None:
        self._pools = tuple(pools)

    async def run(self, update: PoolUpdate) -> None:
        update(self._pools)
