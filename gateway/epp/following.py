"""The response as the picker sees it go by: its first content token and the gaps between
tokens (timed as the chunks pass, a hop before the client has them), the usage the engine
reports (the last streamed event, or the whole JSON answer), and the model name turned
back into the public one. Measures and rewrites; the ledger is told by the stream."""

from __future__ import annotations

from laneway.gateway.serving.engine_usage import StreamUsageWatch, engine_prompt_tokens
from laneway.gateway.serving.first_token import FirstTokenWatch
from laneway.gateway.serving.model_name import ModelNameRewriter

# A non-streaming answer kept for its usage: an answer this long is not one to parse again.
MAX_KEPT_BYTES = 4 * 1024 * 1024


class ResponseWatch:
    """Fed the response body's chunks in order."""

    def __init__(self, *, streaming: bool, rename: ModelNameRewriter | None) -> None:
        self.streaming = streaming
        self._rename = rename
        self._first = FirstTokenWatch()
        self._usage = StreamUsageWatch()
        self._kept: list[bytes] = []  # a whole answer, for its usage
        self._kept_bytes = 0
        self.prompt_tokens: int | None = None  # the engine's count, once it says it

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        """What to pass on for `chunk` and whether it completed the first content token."""
        if self.streaming:
            first = not self._first.seen and self._first.feed(chunk)
            self._usage.feed(chunk)
            self.prompt_tokens = self._usage.usage.prompt_tokens
        else:
            first = False
            if self._kept_bytes <= MAX_KEPT_BYTES:
                self._kept.append(chunk)
                self._kept_bytes += len(chunk)
        return (self._rename.feed(chunk) if self._rename else chunk), first

    def end(self) -> bytes:
        """The rest held back (a partial last line being renamed); the answer's usage read."""
        if not self.streaming and self._kept_bytes <= MAX_KEPT_BYTES:
            self.prompt_tokens = engine_prompt_tokens(b"".join(self._kept))
        return self._rename.flush() if self._rename else b""

    def events(self, chunk: bytes) -> int:
        """How many token events `chunk` holds (the gaps between them are TBT)."""
        return chunk.count(b"data:") - chunk.count(b"[DONE]")
