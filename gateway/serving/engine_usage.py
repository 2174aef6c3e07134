"""What an engine's non-streaming answer says it counted.

vLLM, SGLang and `laneway sim` put `usage.prompt_tokens` in every non-streaming completion:
the engine's own count of the prompt, the count lane edges and context caps are about. The
gateway takes it for the answer's `x-laneway-prompt-tokens` instead of counting the prompt a
second time. It is the request's total over its prompts (vLLM's serving_completion.py and
SGLang's `aggregate_token_usage` add each prompt once, however many choices `n` asks for), so
it stands for the gateway's count, the longest sequence's, only where there is one prompt.
A response (`/v1/responses`) names it `usage.input_tokens`.

`usage.prompt_tokens_details.cached_tokens` (`input_tokens_details` in a response) is how
much of the prompt the engine took from its prefix cache: vLLM reports it with
`--enable-prompt-tokens-details` (0 included; `prompt_tokens_details` is null without the
flag), SGLang with `--enable-cache-report` (only when above 0: its `_details_if_cached` in
entrypoints/openai/usage_processor.py), `laneway sim` always. The operator renders both
flags; a reclaimed request's count of prefill computed twice reads it (`recompute.py`).
A stream carries its usage in an event of its own, where its client asked for one
(`StreamUsageWatch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from laneway.gateway.serving.first_token import StreamLines


@dataclass(frozen=True, slots=True)
class EngineUsage:
    prompt_tokens: int | None  # None: the answer has no count
    cached_tokens: int | None  # None: it did not say (no details, or SGLang's 0)


NO_USAGE = EngineUsage(prompt_tokens=None, cached_tokens=None)
USAGE = b'"usage"'


def engine_usage(answer: bytes) -> EngineUsage:
    """The prompt counts of a JSON answer's `usage`; None for each it has none of that is a
    count."""
    try:
        decoded = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return NO_USAGE
    usage = decoded.get("usage") if isinstance(decoded, dict) else None
    if not isinstance(usage, dict):
        return NO_USAGE
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return EngineUsage(
        prompt_tokens=_count(usage.get("prompt_tokens", usage.get("input_tokens"))),
        cached_tokens=_count(cached),
    )


class StreamUsageWatch:
    """The usage a stream's engine reports in an event of its own (the client asked for it
    with `stream_options.include_usage`), fed the stream's chunks in order. Only chunks
    holding `"usage"` are parsed; of the others, the start of a line whose end has not come
    is kept."""

    def __init__(self) -> None:
        self._lines = StreamLines()
        self.usage = NO_USAGE  # the last usage event's, once one came

    def feed(self, chunk: bytes) -> None:
        lines = self._lines
        if USAGE not in (lines.partial + chunk if lines.partial else chunk):  # most events
            lines.skip(chunk)
            return
        for line in lines.feed(chunk):
            if USAGE in line and line.startswith(b"data:"):
                usage = engine_usage(line[5:])
                if usage.prompt_tokens is not None:
                    self.usage = usage


def engine_prompt_tokens(answer: bytes) -> int | None:
    """`usage.prompt_tokens` of a JSON answer; None where it has none that is a count."""
    return engine_usage(answer).prompt_tokens


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
