"""Answers name the model the client asked for, not the name the engine serves it under.

The gateway rewrites a request's `model` to its pool's `servedModelName` on the way in; on
the way back every JSON body and SSE event carries the served name in its top-level
`"model"` field, which this module turns back into the public name.

Why bytes and not JSON: a stream's hot path should not parse and re-serialise every event.
The rewrite is exact on valid JSON: the pattern needs `{` or `,` right before `"model"`.
A `"` preceded by `{` or `,` cannot close a string (the next character, `m`, would then be
invalid JSON) and cannot sit inside one (it would be escaped as `\\"`), so it opens a key;
the key is `model` and the value is a string that is exactly the served name, since the
served name's own quotes, backslashes and control characters are escaped in the pattern.
vLLM and SGLang write events with pydantic's `model_dump_json` and `laneway sim` with
`json.dumps(separators=(",", ":"))`, both as `"model":"NAME"`; whitespace around the colon
(`json.dumps` defaults, the sim's non-streaming answers) is allowed too. Non-ASCII names are
matched both as raw UTF-8 (pydantic) and as `\\u` escapes (`json.dumps`).

Streams: the transport may split an event anywhere, even inside the field. An SSE `data:`
line holds no newline, so a match never spans one: each chunk is rewritten up to its last
newline and the rest waits for the next chunk. A client's SSE parser cannot use a partial
line anyway, so holding it back delays nothing the client could read.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class _Rename:
    """What rewriting one served name to one public name needs, built once per pair."""

    served_forms: tuple[bytes, ...]  # the served name as JSON, escaped and raw UTF-8
    pattern: re.Pattern[bytes]
    public: bytes
    # The compact spellings every engine streams, as plain replacements: a regex scan
    # costs several times more per event, so it only runs on what they leave.
    compact: tuple[tuple[bytes, bytes], ...]

    def whole(self, body: bytes) -> bytes:
        for served, public in self.compact:
            body = body.replace(served, public)
        for form in self.served_forms:  # a loop, not any(): no generator per event
            if form in body:
                return self.pattern.sub(lambda match: match.group(1) + self.public, body)
        return body


@functools.lru_cache(maxsize=1024)
def _rename(served: str, public: str) -> _Rename:
    forms = tuple(
        dict.fromkeys(
            json.dumps(served, ensure_ascii=ascii_only).encode() for ascii_only in (True, False)
        )
    )
    alternatives = b"|".join(re.escape(form) for form in forms)
    public_json = json.dumps(public).encode()
    return _Rename(
        served_forms=forms,
        pattern=re.compile(rb'([{,]\s*"model"\s*:\s*)(?:' + alternatives + rb")"),
        public=public_json,
        compact=tuple(
            (opener + b'"model":' + form, opener + b'"model":' + public_json)
            for form in forms
            for opener in (b",", b"{")
        ),
    )


class ModelNameRewriter:
    """Served name -> public name in a whole JSON body (`whole`) or a stream (`feed`)."""

    def __init__(self, served: str, public: str) -> None:
        self._rename = _rename(served, public)
        self._carry = b""

    def whole(self, body: bytes) -> bytes:
        return self._rename.whole(body)

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines received so far, rewritten; a partial last line waits."""
        data = self._carry + chunk if self._carry else chunk
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        return self._rename.whole(data[:cut])

    def flush(self) -> bytes:
        """What is left when the stream ends (a well-formed stream leaves nothing)."""
        rest, self._carry = self._carry, b""
        return self._rename.whole(rest)


def rewriter(served: str, public: str) -> ModelNameRewriter | None:
    """None when the client asked for the served name itself: nothing to rewrite."""
    return None if served == public else ModelNameRewriter(served, public)
