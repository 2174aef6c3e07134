"""One request as its log line and metrics tell it, built once when it ends."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLog:
    path: str  # the API path asked for, e.g. /v1/chat/completions
    status: int
    total_ms: float
    model: str = ""
    pool: str = ""
    lane: str = ""
    reason: str = ""  # why this pool
    endpoint: str = ""  # the endpoint tried last
    prompt_tokens: int | None = None
    stream: bool = False
    attempts: int = 0
    requeued: int = 0  # times an attempt was ended to take its replica back (`requeue`)
    # Prefilled again after such an end: exact in the virtual runner, at most in the gateway.
    recomputed_prompt_tokens: int = 0
    queue_ms: float | None = None
    predicted_ttft_ms: float | None = None  # on the endpoint tried last, when it was picked
    ttft_ms: float | None = None
    error: str | None = None

    def line(self, at: float) -> dict[str, object]:
        """The log line's fields, `at` its wall-clock time: empty and unknown ones left out,
        times in milliseconds to two places."""
        line: dict[str, object] = {
            "ts": round(at, 3),
            "path": self.path,
            "status": self.status,
            "total_ms": round(self.total_ms, 2),
        }
        optional: dict[str, object] = {
            "model": self.model,
            "pool": self.pool,
            "lane": self.lane,
            "reason": self.reason,
            "endpoint": self.endpoint,
        }
        line.update((name, value) for name, value in optional.items() if value)
        if self.prompt_tokens is not None:
            line["prompt_tokens"] = self.prompt_tokens
        line["stream"] = self.stream
        line["attempts"] = self.attempts
        if self.requeued:
            line["requeued"] = self.requeued
            line["recomputed_prompt_tokens"] = self.recomputed_prompt_tokens
        timings = {
            "queue_ms": self.queue_ms,
            "predicted_ttft_ms": self.predicted_ttft_ms,
            "ttft_ms": self.ttft_ms,
        }
        line.update((name, round(ms, 2)) for name, ms in timings.items() if ms is not None)
        if self.error:
            line["error"] = self.error
        return line
