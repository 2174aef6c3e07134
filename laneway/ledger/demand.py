"""Each pool's demand as this gateway replica sees it: what waits in the pool's line, what
runs on its engines, and how recent streams met the TTFT SLO.

The operator scales pools on these counts (`laneway.autoscale`): they move the moment a
request arrives, before any engine metric does, and they count requests for a pool at zero,
which no engine can.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

from laneway.autoscale import DemandCount

# Attainment over the last five minutes: long enough to hold a few hundred streams on a
# quiet lane, short enough that the scaler sees a miss while it can still act on it.
SLO_WINDOW_S = 300.0


@dataclass(slots=True)
class _PoolDemand:
    queued_requests: int = 0
    queued_prompt_tokens: int = 0
    in_flight_requests: int = 0
    in_flight_prompt_tokens: int = 0

    def add(self, queued: bool, requests: int, prompt_tokens: int) -> None:
        if queued:
            self.queued_requests += requests
            self.queued_prompt_tokens += prompt_tokens
        else:
            self.in_flight_requests += requests
            self.in_flight_prompt_tokens += prompt_tokens

    @property
    def idle(self) -> bool:
        return not self.queued_requests and not self.in_flight_requests


class DemandBook:
    def __init__(self, window_s: float = SLO_WINDOW_S) -> None:
        self._window_s = window_s
        self._counts: dict[str, _PoolDemand] = {}
        self._ttft: dict[str, collections.deque[tuple[float, bool]]] = {}

    def add(self, pool: str, prompt_tokens: int, *, queued: bool) -> None:
        """Count one request waiting in the pool's line (queued) or on its way to, or served
        by, an engine."""
        count = self._counts.get(pool)
        if count is None:
            count = self._counts[pool] = _PoolDemand()
        count.add(queued, 1, prompt_tokens)

    def remove(self, pool: str, prompt_tokens: int, *, queued: bool) -> None:
        count = self._counts[pool]
        count.add(queued, -1, -prompt_tokens)
        # Pools come and go; one with nothing waiting or running needs no entry.
        if count.idle:
            del self._counts[pool]

    def record_ttft(self, pool: str, now: float, met: bool) -> None:
        recent = self._ttft.get(pool)
        if recent is None:
            recent = self._ttft[pool] = collections.deque()
        recent.append((now, met))

    def snapshot(self, now: float, pools: Iterable[str]) -> dict[str, DemandCount]:
        """The counts of `pools` (the ones configured now) at `now`; the attainment window
        of every other pool is dropped."""
        cutoff = now - self._window_s
        counts = {}
        for pool in pools:
            recent = self._ttft.get(pool, collections.deque())
            while recent and recent[0][0] < cutoff:
                recent.popleft()
            met = sum(1 for _, ok in recent if ok)
            count = self._counts.get(pool, _PoolDemand())
            counts[pool] = DemandCount(
                queued_requests=count.queued_requests,
                queued_prompt_tokens=count.queued_prompt_tokens,
                in_flight_requests=count.in_flight_requests,
                in_flight_prompt_tokens=count.in_flight_prompt_tokens,
                ttft_met=met,
                ttft_missed=len(recent) - met,
            )
        for gone in self._ttft.keys() - counts.keys():
            del self._ttft[gone]
        return counts
