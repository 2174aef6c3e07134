"""Admission: at most `limit` requests of a pool run at once; the rest wait in line.

The order of the line (interactive first, fair share between tenants in the batch lane) is
the routing library's `AdmissionLine`; this shell holds the waiters and wakes them. A
request that cannot even join (the line is full) is refused at once; the handler bounds the
wait and answers both with 429 and Retry-After.
"""

from __future__ import annotations

import asyncio

from laneway.api import Lane
from laneway.routing.admission import AdmissionLine


class AdmissionRefused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "queue_full", "pool_removed" or "shutting_down"


class PoolGate:
    def __init__(self, limit: int, max_waiting: int) -> None:
        self._limit = limit
        self._max_waiting = max_waiting
        self._active = 0
        self._line: AdmissionLine[asyncio.Future[None]] = AdmissionLine()
        self._closed: str | None = None  # why the gate refuses everyone, once it does

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return len(self._line)

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        self._limit = limit
        self._grant()

    def admit_now(self) -> bool:
        """Take a slot if one is free and nobody waits for it; False: `acquire` decides."""
        if self._closed is None and self._active < self._limit and not self._line:
            self._active += 1
            return True
        return False

    async def acquire(self, priority: Lane, tenant: str = "", tokens: int = 0) -> None:
        """Return once admitted; raise AdmissionRefused when full or closed.

        `tenant` and `tokens` place a batch request in the fair-share order.

        Callers bound the wait with `asyncio.timeout`; a cancelled wait leaves no trace.
        """
        if self._closed is not None:
            raise AdmissionRefused(self._closed)
        if self.admit_now():
            return
        if self.waiting >= self._max_waiting:
            raise AdmissionRefused("queue_full")
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.join(slot, priority, tenant, tokens)
        try:
            await slot
        except asyncio.CancelledError:
            # Timed out or the client went away: give back a slot granted in the same tick.
            if slot.done() and not slot.cancelled() and slot.exception() is None:
                self.release()
            else:
                self._line.remove(slot)
            raise

    def release(self) -> None:
        self._active -= 1
        self._grant()

    def close(self, reason: str = "pool_removed") -> None:
        """Refuse everyone waiting and every newcomer; running requests finish (drain)."""
        self._closed = reason
        while self.waiting:
            slot = self._line.next()
            if not slot.done():
                slot.set_exception(AdmissionRefused(reason))

    def _grant(self) -> None:
        while self.waiting and self._active < self._limit:
            slot = self._line.next()
            if slot.done():
                continue  # cancelled by its timeout in this same tick
            self._active += 1
            slot.set_result(None)
