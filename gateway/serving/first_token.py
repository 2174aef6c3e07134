"""Which event of a streamed response is its first token.

A stream may open with events that carry no output. vLLM and SGLang send a chat response's
role chunk (`delta: {role, content: ""}`) together with the first output (the first pass of
the loop over engine results in vLLM's `chat_completion_stream_generator` and SGLang's
`_generate_chat_stream`, both in `serving_chat.py`), but other servers, and older versions,
send it as soon as the request arrives, before any prefill; usage and keep-alive events
carry nothing either. So the time to first token is taken at the first event that carries
output, whatever the engine sends before it: text, a tool call, reasoning text or logprobs.

A Responses stream (`/v1/responses`) names its events (`event: TYPE`, the type again in the
data): its first token is the first `*.delta` event with a non-empty `delta`
(`response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`, `response.refusal.delta`); `response.created`,
`response.in_progress` and the `*.added` events come before any prefill (vLLM's
`responses_stream_generator` sends the first two on arrival). Its TBT runs between those
content events alone, not the `.done` and `.added` bookkeeping around them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

from laneway.gateway.serving.request_body import Endpoint

DATA = b"data:"
DONE = b"[DONE]"
STREAM_END = DATA + b" " + DONE
RESPONSE_DELTA = ".delta"
# In a chunk of Responses events, each content event's type ends its JSON string so:
# `"type":"response.output_text.delta"` (a quote inside text is escaped, `\"`).
DELTA_TYPE_END = b'.delta"'
# Keys of a chat `delta` whose non-empty value is model output.
DELTA_OUTPUT_KEYS = ("content", "tool_calls", "function_call", "reasoning_content", "reasoning")


def carries_output(line: bytes) -> bool:
    """Whether one SSE line is a `data:` event with output in any of its choices."""
    line = line.strip()
    if not line.startswith(DATA):
        return False
    payload = line[len(DATA) :].strip()
    if not payload or payload == DONE:
        return False
    try:
        event = _loads(payload)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    kind = event.get("type")
    if isinstance(kind, str):  # a Responses event; chat and completion chunks have no type
        return kind.endswith(RESPONSE_DELTA) and bool(event.get("delta"))
    if not isinstance(event.get("choices"), list):
        return False
    return any(_choice_has_output(choice) for choice in event["choices"])


def _loads(payload: bytes) -> Any:
    """orjson, several times faster; `json` for what only it reads (NaN, huge integers)."""
    try:
        return orjson.loads(payload)
    except ValueError:
        return json.loads(payload)


def _choice_has_output(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    if choice.get("text") or _has_data(choice.get("logprobs")):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(delta.get(key) for key in DELTA_OUTPUT_KEYS)


def _has_data(logprobs: Any) -> bool:
    """`logprobs: null`, `{}` and `{"content": null}` say nothing; anything else is output."""
    if isinstance(logprobs, dict):
        return any(logprobs.values())
    return bool(logprobs)


def content_events_of(endpoint: Endpoint) -> Callable[[bytes], int]:
    """How many content events a relayed chunk of `endpoint`'s stream holds (for TBT): a
    chat or completion chunk's `data:` events but the end marker, a response's deltas."""
    if endpoint is Endpoint.RESPONSES:
        return lambda chunk: chunk.count(DELTA_TYPE_END)
    return lambda chunk: chunk.count(DATA) - chunk.count(STREAM_END)


class StreamLines:
    """The whole lines of a stream fed in chunks, in order: a line split over chunks comes
    out once its end has arrived."""

    def __init__(self) -> None:
        self.partial = b""  # the start of a line whose end has not arrived yet

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return lines

    def skip(self, chunk: bytes) -> None:
        """Take a chunk whose whole lines the reader does not want: only a line it leaves
        unfinished is kept."""
        end = chunk.rfind(b"\n")
        self.partial = self.partial + chunk if end < 0 else chunk[end + 1 :]


class FirstTokenWatch:
    """Fed a stream's bytes as they arrive; says which chunk completed the first token."""

    def __init__(self) -> None:
        self.seen = False
        self._lines = StreamLines()

    def feed(self, chunk: bytes) -> bool:
        """True for the chunk that completes the first event carrying output, else False."""
        if self.seen:
            return False
        if any(carries_output(line) for line in self._lines.feed(chunk)):
            self.seen, self._lines = True, StreamLines()
        return self.seen
