"""When the gateway stops: on a signal, or when a background task it cannot serve without dies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Stop:
    requested: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None  # None: a clean stop (a signal)

    def fail(self, reason: str) -> None:
        self.failure = reason
        self.requested.set()
