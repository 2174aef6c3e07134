"""Parsing OpenAI request bodies: the few fields routing needs, checked, the rest passed on
as `engine_body.py` allows.

Pure: bytes in, a `ParsedRequest` out, or an ApiError(400) that names the field.

Every text an engine tokenizes is kept for counting: message contents, roles, names, tool
calls' arguments, the tool definitions a chat template renders into the prompt, a
completion's suffix and every prompt of a list. Work is linear in the body's size; the
caller runs big bodies off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from laneway.api import Lane
from laneway.gateway.errors import ApiError, bad_request
from laneway.gateway.serving.engine_body import refuse_engine_control
from laneway.responses_input import ResponsesInputError, responses_chat
from laneway.tokens import (
    ChatMessage,
    TemplateChat,
    TokenBounds,
    Tokenizer,
    chat_bounds,
    chat_framing_tokens,
    count_chat,
    count_rendered_chat,
    count_texts,
    rendered_chat_bounds,
    template_chat,
    texts_bounds,
    utf8_length,
)

LANE_HEADER = "x-laneway-lane"
# Deeper bodies are refused before anything recurses over them (the JSON encoder that
# forwards them would); real requests, JSON schemas included, nest a few dozen levels.
MAX_NESTING = 64
# Parsing holds the interpreter lock for its whole run, in a worker thread too, and its cost
# is the number of JSON values: 200k tiny messages in 4 MB hold it for ~160 ms, a 4 MB
# prompt for ~10 ms. Bodies with more containers or string elements than this are refused
# before parsing (~25 ms of parse at most); a real request has a few hundred, and so many
# braces inside prompt text would be far past any model's context.
MAX_JSON_VALUES = 32_768


class Endpoint(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"  # its input framed as a chat (laneway/responses_input.py)


@dataclass(frozen=True)
class ParsedRequest:
    endpoint: Endpoint
    payload: Mapping[str, Any]  # the whole body, forwarded with `model` rewritten
    model: str
    stream: bool
    max_tokens: int | None
    messages: tuple[ChatMessage, ...] = ()  # chat
    contents: tuple[str, ...] = ()  # chat: each message's content text, for a chat template
    # completions: text prompts, or prompts already tokenized (their counts are exact)
    prompts: tuple[str, ...] = ()
    token_prompt_lengths: tuple[int, ...] = ()
    # Prompt text outside messages and prompts: tool definitions, a completion's suffix.
    extra_texts: tuple[str, ...] = ()
    choices: int = 1  # completions generated per prompt (`n`, or `best_of` when larger)
    # responses: the chat the engine renders (`messages`, `tools`), converted from the input
    chat_input: Mapping[str, Any] | None = None
    previous_response_id: str | None = None  # responses: the turn this one continues

    @property
    def is_chat(self) -> bool:
        """Framed by a chat template: a chat completion, or a response's input."""
        return self.endpoint is not Endpoint.COMPLETIONS

    @property
    def asks_store(self) -> bool:
        """responses: whether the request asks its engine to keep the response (OpenAI's
        default; vLLM keeps nothing for `store: null` either)."""
        return self.payload.get("store", True) is True

    @property
    def chat_body(self) -> Mapping[str, Any]:
        """Where the chat's `messages` and `tools` are: the body, or a response's input."""
        return self.payload if self.chat_input is None else self.chat_input

    priority: int | None = None  # the client's `priority`: a later place it asks for

    @property
    def sequences(self) -> int:
        """Prompts the engine runs: one per chat, one per prompt of a completions list."""
        if self.is_chat:
            return 1
        return len(self.prompts) + len(self.token_prompt_lengths)

    @property
    def text_chars(self) -> int:
        """Characters of prompt text, all sequences together: what counting it costs."""
        texts = sum(len(t) for t in self.extra_texts)
        if self.is_chat:
            return texts + sum(len(m.role) + len(m.content) for m in self.messages)
        return texts + sum(len(p) for p in self.prompts)

    def template_chat(self) -> TemplateChat:
        """The chat as the engine's chat template sees it (the payload's messages and tools)."""
        chat = self.chat_body
        return template_chat(chat["messages"], self.contents, chat.get("tools"))

    def rendered_specials(self, tokenizer: Tokenizer) -> int:
        """Special tokens the engine adds around a rendered chat: none for a chat completion,
        the prompt's (a BOS beside the template's own) for a response. vLLM 0.32 tokenizes a
        response's rendered chat with `add_special_tokens` left at its default, true
        (`ResponsesRequest.build_tok_params`, vllm/entrypoints/openai/responses/protocol.py;
        `TokenizeParams`, vllm/renderers/params.py); a chat completion's says false."""
        return tokenizer.prompt_specials if self.endpoint is Endpoint.RESPONSES else 0

    def bounds(self, tokenizer: Tokenizer) -> TokenBounds:
        """Bounds on the longest sequence's prompt: what must fit one engine's context."""
        template = tokenizer.chat_template
        if self.is_chat and template is not None:
            # The template renders the tools (or leaves them out) itself.
            around = self.rendered_specials(tokenizer)
            rendered = rendered_chat_bounds(tokenizer, template, self.template_chat())
            return rendered + TokenBounds(around, around)
        extra = texts_bounds(tokenizer, self.extra_texts)
        if self.is_chat:
            return chat_bounds(tokenizer, self.messages) + extra
        # Several prompts run as separate sequences: the longest one decides fit.
        specials = TokenBounds(tokenizer.prompt_specials, tokenizer.prompt_specials)
        bounds = [tokenizer.bounds(p) + specials for p in self.prompts] + [
            TokenBounds(n, n) for n in self.token_prompt_lengths
        ]
        return TokenBounds(max(b.low for b in bounds), max(b.high for b in bounds)) + extra

    def length_bounds(self, tokenizer: Tokenizer) -> TokenBounds | None:
        """`bounds` from the texts' lengths alone (in constant time for ASCII text): looser,
        and often enough to route. None for a chat a template frames: its text is unknown
        until rendered."""
        if self.is_chat and tokenizer.chat_template is not None:
            return None
        extra = sum(utf8_length(t) for t in self.extra_texts)
        if self.is_chat:
            framing = chat_framing_tokens(len(self.messages))
            texts = sum(utf8_length(m.role) + utf8_length(m.content) for m in self.messages)
            counted = tokenizer.length_bounds(texts + extra)
            return TokenBounds(counted.low + framing, counted.high + framing)
        specials = tokenizer.prompt_specials
        prompts = [tokenizer.length_bounds(utf8_length(p)) for p in self.prompts]
        lows = [b.low + specials for b in prompts] + list(self.token_prompt_lengths)
        highs = [b.high + specials for b in prompts] + list(self.token_prompt_lengths)
        around = tokenizer.length_bounds(extra)
        return TokenBounds(max(lows) + around.low, max(highs) + around.high)

    def prefix_text(self) -> str:
        """The prompt as one string whose prefixes are the prompt's prefixes (for affinity):
        a chat's history resent with a new message extends the previous turn's text."""
        if self.is_chat:
            return "".join(f"{m.role}\n{m.content}\n" for m in self.messages)
        return self.prompts[0] if len(self.prompts) == 1 else ""

    def count(self, tokenizer: Tokenizer) -> int:
        """The longest sequence's prompt tokens."""
        template = tokenizer.chat_template
        if self.is_chat and template is not None:
            rendered = count_rendered_chat(tokenizer, template, self.template_chat())
            return rendered + self.rendered_specials(tokenizer)
        extra = count_texts(tokenizer, self.extra_texts)
        if self.is_chat:
            return count_chat(tokenizer, self.messages) + extra
        specials = tokenizer.prompt_specials
        return extra + max(
            [tokenizer.count(p) + specials for p in self.prompts] + list(self.token_prompt_lengths)
        )

    def charge(self, prompt_tokens: int, context_tokens: int) -> int:
        """Tokens the engine may really process for this request, `prompt_tokens` being the
        longest sequence's: every sequence's prompt and every completion, each completion
        up to `max_tokens` or, without it, up to the context that remains."""
        room = max(context_tokens - prompt_tokens, 1)
        completion = min(self.max_tokens, room) if self.max_tokens else room
        return self.sequences * (prompt_tokens + self.choices * completion)


def json_values(body: bytes) -> int:
    """At least the body's JSON objects, lists and list items of strings (what
    MAX_JSON_VALUES limits), and exactly that when it is over the limit: 413 then."""
    containers = body.count(b"{") + body.count(b"[")
    # Every `","` or `", "` starts at a quote of its own, so counting quotes bounds them
    # from above in one single-byte scan, where the two patterns cost two scans 2x as slow.
    at_most = containers + body.count(b'"')
    if at_most <= MAX_JSON_VALUES:
        return at_most
    values = containers + body.count(b'","') + body.count(b'", "')
    if values > MAX_JSON_VALUES:
        raise ApiError(
            413,
            f"The request body holds about {values} JSON objects, lists or list items, "
            f"more than the limit of {MAX_JSON_VALUES}",
            "too_many_json_values",
        )
    return values


def parse_request(body: bytes, endpoint: Endpoint) -> ParsedRequest:
    # Every value json_values counts takes a byte of its own: a body no longer than the
    # limit is within it, and is not scanned (three passes over it, on every request).
    if len(body) > MAX_JSON_VALUES:
        json_values(body)
    return parse_scanned(body, endpoint)


def parse_scanned(body: bytes, endpoint: Endpoint) -> ParsedRequest:
    """`parse_request` for a body whose `json_values` the caller has checked."""
    try:
        payload = orjson.loads(body)
    except (ValueError, RecursionError) as error:
        # orjson's JSONDecodeError is a ValueError: malformed JSON, bad UTF-8, numbers out of
        # range, nesting past its own limit.
        raise bad_request(f"The request body is not valid JSON: {_short(error)}") from None
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object")
    if _too_deep(payload, MAX_NESTING):
        raise bad_request(f"The request body nests JSON deeper than {MAX_NESTING} levels")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    stream = payload.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_request(f"'stream' must be a boolean, got {_short(stream)}", "stream")
    refuse_engine_control(payload)
    max_tokens = _max_tokens(payload, endpoint)
    priority = _priority(payload)
    if endpoint is Endpoint.RESPONSES:
        return _responses_request(payload, model, bool(stream), max_tokens, priority)
    if endpoint is Endpoint.CHAT:
        messages, contents = _messages(payload)
        return ParsedRequest(
            endpoint,
            payload,
            model,
            bool(stream),
            max_tokens,
            messages=messages,
            contents=contents,
            extra_texts=_tool_texts(payload),
            choices=_positive(payload, "n"),
            priority=priority,
        )
    prompts, token_lengths = _prompts(payload)
    suffix = payload.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad_request("'suffix' must be a string", "suffix")
    return ParsedRequest(
        endpoint,
        payload,
        model,
        bool(stream),
        max_tokens,
        prompts=prompts,
        token_prompt_lengths=token_lengths,
        extra_texts=(suffix,) if suffix else (),
        choices=max(_positive(payload, "n"), _positive(payload, "best_of")),
        priority=priority,
    )


def _responses_request(
    payload: Mapping[str, Any],
    model: str,
    stream: bool,
    max_tokens: int | None,
    priority: int | None,
) -> ParsedRequest:
    """A response's input as the chat the engine renders; its history is the engine's."""
    try:
        chat = responses_chat(payload)
    except ResponsesInputError as error:
        raise bad_request(str(error), error.param) from None
    if payload.get("background"):
        # vLLM answers a background response `queued` at once and generates it afterwards,
        # outside the pool's slots and the tenant's limits: a tenant could run any number.
        raise ApiError(
            400,
            "'background' responses are not served through this gateway: they would run "
            "outside the pool's slots and the tenant's limits; stream the response instead",
            "unsupported_value",
            "background",
        )
    previous = payload.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise bad_request("'previous_response_id' must be a non-empty string",
                          "previous_response_id")  # fmt: skip
    chat_input = {"messages": list(chat.messages), "tools": list(chat.tools or ()) or None}
    if not chat.messages:
        raise bad_request("'input' must hold at least one message", "input")
    messages, contents = _messages(chat_input)
    return ParsedRequest(
        Endpoint.RESPONSES,
        payload,
        model,
        stream,
        max_tokens,
        messages=messages,
        contents=contents,
        extra_texts=_tool_texts(chat_input),
        chat_input=chat_input,
        previous_response_id=previous,
        priority=priority,
    )


def parse_lane(value: str | None) -> Lane | None:
    if value is None:
        return None
    try:
        return Lane(value.strip().lower())
    except ValueError:
        lanes = ", ".join(lane.value for lane in Lane)
        raise bad_request(
            f"Header {LANE_HEADER} must be one of {lanes}, got {value!r}", LANE_HEADER
        ) from None


def _max_tokens(payload: Mapping[str, Any], endpoint: Endpoint) -> int | None:
    names = {
        Endpoint.CHAT: ("max_completion_tokens", "max_tokens"),
        Endpoint.RESPONSES: ("max_output_tokens",),
    }.get(endpoint, ("max_tokens",))
    for name in names:
        value = payload.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad_request(f"'{name}' must be a positive integer, got {_short(value)}", name)
        return value
    return None


def _priority(payload: Mapping[str, Any]) -> int | None:
    value = payload.get("priority")
    if value is None:
        return None
    # vLLM takes a 64-bit integer; a larger one would fail there instead of here.
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise bad_request(f"'priority' must be a 64-bit integer, got {_short(value)}", "priority")
    return value


def _positive(payload: Mapping[str, Any], name: str) -> int:
    value = payload.get(name)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{name}' must be a positive integer, got {_short(value)}", name)
    return value


def _short(value: object) -> str:
    """A value for an error message: its repr, cut short (never a digit conversion)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "an integer that large"
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _too_deep(value: dict[str, Any], limit: int) -> bool:
    """Whether JSON containers nest more than `limit` levels; one pass, no recursion."""
    level: list[dict[str, Any] | list[Any]] = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _tool_texts(payload: Mapping[str, Any]) -> tuple[str, ...]:
    """Tool definitions, as a chat template renders them into the prompt (as JSON)."""
    texts = []
    for name in ("tools", "functions"):
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            raise bad_request(f"'{name}' must be a list", name)
        texts.append(json.dumps(value, ensure_ascii=False))
    return tuple(texts)


def _messages(payload: Mapping[str, Any]) -> tuple[tuple[ChatMessage, ...], tuple[str, ...]]:
    """Each message as counted without a template (every text it holds, one string), and
    each message's content text (what a template renders as its content)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", "messages")
    parsed = []
    contents = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{param}' must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"'{param}.role' must be a non-empty string", f"{param}.role")
        content = _content_text(message.get("content"), param)
        contents.append(content)
        texts = [content]
        for field in ("name", "tool_call_id"):
            value = message.get(field)
            if value is not None and not isinstance(value, str):
                raise bad_request(f"'{param}.{field}' must be a string", f"{param}.{field}")
            texts.append(value or "")
        texts.extend(_tool_call_texts(message.get("tool_calls"), param))
        parsed.append(ChatMessage(role, "\n".join(t for t in texts if t)))
    return tuple(parsed), tuple(contents)


def _tool_call_texts(tool_calls: object, param: str) -> list[str]:
    """The function names and arguments of an assistant message's tool calls."""
    if tool_calls is None:
        return []
    where = f"{param}.tool_calls"
    if not isinstance(tool_calls, list):
        raise bad_request(f"'{where}' must be a list", where)
    texts = []
    for index, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise bad_request(f"'{where}[{index}].function' must be an object", where)
        for field in ("name", "arguments"):
            value = function.get(field)
            if value is not None and not isinstance(value, str):
                raise bad_request(f"'{where}[{index}].function.{field}' must be a string", where)
            texts.append(value or "")
    return texts


def _content_text(content: object, param: str) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(
                    f"'{param}.content[{index}]' must be an object with a 'type'",
                    f"{param}.content",
                )
            if part["type"] == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise bad_request(
                        f"'{param}.content[{index}].text' must be a string", f"{param}.content"
                    )
                texts.append(text)
        return "\n".join(texts)
    raise bad_request(
        f"'{param}.content' must be a string or a list of content parts", f"{param}.content"
    )


def _prompts(payload: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    prompt = payload.get("prompt")
    wrong = bad_request(
        "'prompt' must be a string, a list of strings, a list of token ids "
        "or a list of lists of token ids",
        "prompt",
    )
    if isinstance(prompt, str):
        return (prompt,), ()
    if not isinstance(prompt, list) or not prompt:
        raise wrong
    if all(isinstance(p, str) for p in prompt):
        return tuple(prompt), ()
    if _token_ids(prompt):
        return (), (len(prompt),)
    if all(isinstance(p, list) and p and _token_ids(p) for p in prompt):
        return (), tuple(len(p) for p in prompt)
    raise wrong


def _token_ids(values: Sequence[object]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
