"""Admission: at most `limit` requests of a pool run at once; the rest wait in line.

The line serves interactive requests before batch ones and is FIFO within each class. A
request that cannot even join (the line is full) is refused at once; the handler bounds the
wait and answers both with 429 and Retry-After.
"""

from __future__ import annotations

import asyncio
from collections import deque

from laneway.api import Lane

SERVICE_ORDER = (Lane.INTERACTIVE, Lane.BATCH)


class AdmissionRefused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "queue_full" or "pool_removed"


class PoolGate:
    def __init__(self, limit: int, max_waiting: int) -> None:
        self._limit = limit
        self._max_waiting = max_waiting
        self._active = 0
        self._lines: dict[Lane, deque[asyncio.Future[None]]] = {
            lane: deque() for lane in SERVICE_ORDER
        }
        self._closed = False

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        self._limit = limit
        self._grant()

    async def acquire(self, priority: Lane) -> None:
        """Return once admitted; raise AdmissionRefused when full or closed.

        Callers bound the wait with `asyncio.timeout`; a cancelled wait leaves no trace.
        """
        if self._closed:
            raise AdmissionRefused("pool_removed")
        if self._active < self._limit and not self.waiting:
            self._active += 1
            return
        if self.waiting >= self._max_waiting:
            raise AdmissionRefused("queue_full")
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines[priority].append(slot)
        try:
            await slot
        except asyncio.CancelledError:
            # Timed out or the client went away: give back a slot granted in the same tick.
            if slot.done() and not slot.cancelled() and slot.exception() is None:
                self.release()
            elif slot in self._lines[priority]:
                self._lines[priority].remove(slot)
            raise

    def release(self) -> None:
        self._active -= 1
        self._grant()

    def close(self) -> None:
        """The pool is gone: refuse everyone waiting; running requests finish (drain)."""
        self._closed = True
        for line in self._lines.values():
            while line:
                slot = line.popleft()
                if not slot.done():
                    slot.set_exception(AdmissionRefused("pool_removed"))

    def _grant(self) -> None:
        for lane in SERVICE_ORDER:
            line = self._lines[lane]
            while line and self._active < self._limit:
                slot = line.popleft()
                if slot.done():
                    continue  # cancelled by its timeout in this same tick
                self._active += 1
                slot.set_result(None)
