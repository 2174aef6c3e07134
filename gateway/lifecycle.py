"""The gateway's lifecycle: when it stops (on a signal, or when a background task it cannot
serve without dies), and the background tasks that live as long as the app."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stop:
    requested: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None  # None: a clean stop (a signal)

    def fail(self, reason: str) -> None:
        self.failure = reason
        self.requested.set()


@contextlib.asynccontextmanager
async def background(*tasks: asyncio.Task[Any]) -> AsyncIterator[None]:
    """`tasks` run while the block does; at its end each is cancelled and collected.

    Failures were reported when they happened (a done callback, the task's own log); here
    they are only collected, so that one task's error never leaves another running.
    """
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
