"""A whole answer read as a stream: the gateway asks the engine to stream a batch-lane request its
client sent with `stream: false`, watches the stream's first token as it does a streamed request's
(the ledger frees a fed batch replica's prefill then, TTFT is measured, and a reclaim after it still
requeues the request, since its client has seen nothing), and answers the client with the whole
response put together from the stream's chunks, as the engine answers it unstreamed.

Both engines stream both completion endpoints with `stream_options.include_usage`, the same
choices and usage as their whole answers, the final usage event with the prompt's
`prompt_tokens_details` (vLLM 0.32: `chat_completion_stream_generator` and
`completion_stream_generator` in `entrypoints/openai/chat_completion/serving.py` and
`completion/serving.py`, the choice models with `stop_reason` in their `protocol.py`;
SGLang: `_generate_chat_stream` and `_generate_completion_stream` in
`srt/entrypoints/openai/serving_chat.py` and `serving_completions.py`):

- `chat.completion`: each choice's `delta.content` and `delta.reasoning_content` (or
  `reasoning`) concatenated, its role, its `tool_calls` merged by their `index` (the first
  `id` and `type`, the function's `name` and `arguments` concatenated), `logprobs.content`
  concatenated, the last `finish_reason` and `stop_reason`;
- `text_completion`: each choice's `text` and each of its `logprobs` lists concatenated;
- `usage` from the final usage event (`prompt_tokens_details.cached_tokens` included).

A request whose whole answer holds what a stream does not carry the same way stays
unstreamed upstream (`streams_whole`): `prompt_logprobs` (a top-level field of the whole
answer, which vLLM refuses on a stream: its request models' validators), `echo` (the prompt
in the answer) and `best_of` (the best `n` of more candidates, chosen at the end; older vLLM
refused it on a stream). An `error` event mid-stream becomes the answer the unstreamed
request would have got: that error body, with its `code` as the status. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from laneway.api import Lane
from laneway.gateway.serving.first_token import DATA, DONE, StreamLines
from laneway.gateway.serving.request_body import Endpoint, ParsedRequest

# Request fields whose whole answer a stream does not carry the same way.
WHOLE_ONLY = ("prompt_logprobs", "echo", "best_of")
STREAM_OPTIONS = {"include_usage": True}
CHUNK_ENVELOPE = ("id", "object", "created", "model", "choices", "usage")
WHOLE_OBJECT = {Endpoint.CHAT: "chat.completion", Endpoint.COMPLETIONS: "text_completion"}


def streams_whole(parsed: ParsedRequest, lane: Lane) -> bool:
    """Whether an unstreamed request is asked of its engine as a stream and answered whole:
    on the batch lane, whose replicas are fed a document per first token. An interactive
    pool frees nothing at a first token, and its answers keep their one parse each."""
    if lane is not Lane.BATCH or parsed.stream or parsed.endpoint not in WHOLE_OBJECT:
        return False
    return all(parsed.payload.get(name) in (None, False) for name in WHOLE_ONLY)


class StreamIncomplete(Exception):
    """The stream ended before its end marker or error: no whole answer can be made."""


@dataclass(frozen=True, slots=True)
class Assembled:
    status: int
    body: bytes


@dataclass
class _ToolCall:
    id: str | None = None
    type: str | None = None
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)

    def whole(self) -> dict[str, Any]:
        function = {"name": "".join(self.name), "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": self.type or "function", "function": function}


@dataclass
class _Choice:
    index: int
    role: str | None = None
    texts: list[str] = field(default_factory=list)  # chat content or completion text
    saw_text: bool = False
    reasoning: dict[str, list[str]] = field(default_factory=dict)  # by the key it came in
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    logprobs: dict[str, list[Any]] | None = None  # None: no chunk carried any
    finish_reason: str | None = None
    stop_reason: Any = None
    saw_stop_reason: bool = False


class WholeAnswer:
    """Fed an engine's stream of one request in order; `result` is the whole answer."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._object = WHOLE_OBJECT[endpoint]
        self._chat = endpoint is Endpoint.CHAT
        self._lines = StreamLines()
        self._envelope: dict[str, Any] = {}  # the first chunk's id, created, model, ...
        self._choices: dict[int, _Choice] = {}
        self._usage: Any = None
        self._error: Assembled | None = None
        self._done = False

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            line = line.strip()
            if line.startswith(DATA) and not self._done and self._error is None:
                self._event(line[len(DATA) :].strip())

    def result(self) -> Assembled:
        """The whole answer: the engine's error where it sent one; StreamIncomplete where
        the stream ended before its end marker."""
        if self._lines.partial.strip().startswith(DATA):
            self.feed(b"\n")  # the last line, where the engine closed without a newline
        if self._error is not None:
            return self._error
        if not self._done:
            raise StreamIncomplete("the engine's stream ended before its end marker")
        whole = {
            "id": self._envelope.get("id"),
            "object": self._object,
            "created": self._envelope.get("created"),
            "model": self._envelope.get("model"),
            **{k: v for k, v in self._envelope.items() if k not in CHUNK_ENVELOPE},
            "choices": [self._whole(self._choices[i]) for i in sorted(self._choices)],
        }
        if self._usage is not None:
            whole["usage"] = self._usage
        return Assembled(status=200, body=orjson.dumps(whole))

    def _event(self, payload: bytes) -> None:
        if payload == DONE:
            self._done = True
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return  # not an event of the API (a keep-alive, a comment)
        if not isinstance(event, dict):
            return
        if "error" in event:
            self._error = _error(event)
            return
        if not self._envelope:
            self._envelope = {k: v for k, v in event.items() if k not in ("choices", "usage")}
        if event.get("usage") is not None:
            self._usage = event["usage"]
        for choice in event.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("index", 0), int):
                index = choice.get("index", 0)
                self._add(self._choices.setdefault(index, _Choice(index)), choice)

    def _add(self, choice: _Choice, chunk: dict[str, Any]) -> None:
        if self._chat:
            delta = chunk.get("delta") or {}
            choice.role = choice.role or delta.get("role")
            if isinstance(delta.get("content"), str):
                choice.texts.append(delta["content"])
                choice.saw_text = True
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    choice.reasoning.setdefault(key, []).append(delta[key])
            for call in delta.get("tool_calls") or ():
                _merge_tool_call(choice, call)
        elif isinstance(chunk.get("text"), str):
            choice.texts.append(chunk["text"])
            choice.saw_text = True
        logprobs = chunk.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice.logprobs if choice.logprobs is not None else {}
            for key, values in logprobs.items():
                if isinstance(values, list):
                    merged.setdefault(key, []).extend(values)
                else:
                    merged.setdefault(key, values)
            choice.logprobs = merged
        if chunk.get("finish_reason") is not None:
            choice.finish_reason = chunk["finish_reason"]
        if "stop_reason" in chunk:
            choice.saw_stop_reason = True
            if chunk["stop_reason"] is not None or choice.stop_reason is None:
                choice.stop_reason = chunk["stop_reason"]

    def _whole(self, choice: _Choice) -> dict[str, Any]:
        text = "".join(choice.texts) if choice.saw_text else None
        whole: dict[str, Any] = {"index": choice.index}
        if self._chat:
            message: dict[str, Any] = {"role": choice.role or "assistant", "content": text}
            for key, parts in choice.reasoning.items():
                message[key] = "".join(parts)
            if choice.tool_calls:
                calls = choice.tool_calls
                message["tool_calls"] = [calls[i].whole() for i in sorted(calls)]
            whole["message"] = message
        else:
            whole["text"] = text or ""
        whole["logprobs"] = choice.logprobs
        whole["finish_reason"] = choice.finish_reason
        if choice.saw_stop_reason:
            whole["stop_reason"] = choice.stop_reason
        return whole


def _merge_tool_call(choice: _Choice, call: Any) -> None:
    if not isinstance(call, dict):
        return
    index = call.get("index", len(choice.tool_calls))
    merged = choice.tool_calls.setdefault(index, _ToolCall())
    merged.id = merged.id or call.get("id")
    merged.type = merged.type or call.get("type")
    function = call.get("function") or {}
    if isinstance(function.get("name"), str):
        merged.name.append(function["name"])
    if isinstance(function.get("arguments"), str):
        merged.arguments.append(function["arguments"])


def _error(event: dict[str, Any]) -> Assembled:
    """The status and body of the engine's unstreamed answer for an error it streamed: its
    `code` where that is an HTTP error status (vLLM's and SGLang's `ErrorResponse`), else 500."""
    error = event["error"]
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return Assembled(status=status, body=orjson.dumps(event))
