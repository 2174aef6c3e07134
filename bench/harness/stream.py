"""One streamed OpenAI request, timed as a user sees it: the first token, every gap between
two tokens, the whole request; and the HTTP client the load generators share."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class StreamResult:
    """One streamed request in wall-clock seconds, before any time scaling."""

    status: int
    headers: Mapping[str, str]
    ttft_s: float | None
    gaps_s: tuple[float, ...]
    e2e_s: float
    output_tokens: int
    error: str | None
    error_code: str | None = None  # the OpenAI error's `code`, when the error had one
    text: str = ""  # the streamed content, when asked to keep it
    sent_at: float = 0.0  # when it was sent, on the clock it was timed by


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    keep_text: bool = False,
) -> StreamResult:
    """POST a `stream: true` OpenAI request and time each token as it arrives; with
    `keep_text`, also keep what it says (a chat client sends it back in the next turn)."""
    start = clock()
    arrivals: list[float] = []
    parts: list[str] = []
    error: str | None = None
    code: str | None = None
    async with session.post(url, json=body, headers=headers) as response:
        reply_headers = {k.lower(): v for k, v in response.headers.items()}
        if response.status != 200:
            reply = await response.read()
            error, code = _error_message(reply), _error_code(reply)
            return StreamResult(
                status=response.status,
                headers=reply_headers,
                ttft_s=None,
                gaps_s=(),
                e2e_s=clock() - start,
                output_tokens=0,
                error=error,
                error_code=code,
                sent_at=start,
            )
        done = False
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            event = json.loads(payload)
            if "error" in event:
                error, code = _error_message(payload), _error_code(payload)
                break
            content = _token_text(event)
            if content:
                arrivals.append(clock())
                if keep_text:
                    parts.append(content)
        end = clock()
    if not done and error is None:
        error = "stream ended without [DONE]"
    gaps = tuple(b - a for a, b in itertools.pairwise(arrivals))
    ttft = arrivals[0] - start if arrivals else None
    text = "".join(parts)
    return StreamResult(
        status=200,
        headers=reply_headers,
        ttft_s=ttft,
        gaps_s=gaps,
        e2e_s=end - start,
        output_tokens=len(arrivals),
        error=error,
        error_code=code,
        text=text,
        sent_at=start,
    )


def _token_text(event: Mapping[str, Any]) -> str:
    """The content a streamed chunk carries ("" for a role-only or empty chunk)."""
    text = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, Mapping) else choice.get("text")
        if content:
            text += str(content)
    return text


def _error_code(body: bytes) -> str | None:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return None if code is None else str(code)


def _error_message(body: bytes) -> str:
    try:
        document = json.loads(body)
        message = document["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")[:200] or "(empty body)"
    return str(message)


def client_session() -> aiohttp.ClientSession:
    """A load generator's HTTP client: as many connections as it has requests, no deadline."""
    connector = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
