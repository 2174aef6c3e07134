"""Parsing OpenAI request bodies: the few fields routing needs, checked, the rest passed on.

Pure: bytes in, a `ParsedRequest` out, or an ApiError(400) that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from laneway.api import Lane
from laneway.gateway.errors import bad_request
from laneway.tokens import ChatMessage, TokenBounds, Tokenizer, chat_bounds, count_chat

LANE_HEADER = "x-laneway-lane"


class Endpoint(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class ParsedRequest:
    endpoint: Endpoint
    payload: Mapping[str, Any]  # the whole body, forwarded with `model` rewritten
    model: str
    stream: bool
    max_tokens: int | None
    messages: tuple[ChatMessage, ...] = ()  # chat
    # completions: text prompts, or prompts already tokenized (their counts are exact)
    prompts: tuple[str, ...] = ()
    token_prompt_lengths: tuple[int, ...] = ()

    def bounds(self, tokenizer: Tokenizer) -> TokenBounds:
        if self.endpoint is Endpoint.CHAT:
            return chat_bounds(tokenizer, self.messages)
        # Several prompts run as separate sequences: the longest one decides fit.
        bounds = [tokenizer.bounds(p) for p in self.prompts] + [
            TokenBounds(n, n) for n in self.token_prompt_lengths
        ]
        return TokenBounds(max(b.low for b in bounds), max(b.high for b in bounds))

    def prefix_text(self) -> str:
        """The prompt as one string whose prefixes are the prompt's prefixes (for affinity):
        a chat's history resent with a new message extends the previous turn's text."""
        if self.endpoint is Endpoint.CHAT:
            return "".join(f"{m.role}\n{m.content}\n" for m in self.messages)
        return self.prompts[0] if len(self.prompts) == 1 else ""

    def count(self, tokenizer: Tokenizer) -> int:
        if self.endpoint is Endpoint.CHAT:
            return count_chat(tokenizer, self.messages)
        return max([tokenizer.count(p) for p in self.prompts] + list(self.token_prompt_lengths))


def parse_request(body: bytes, endpoint: Endpoint) -> ParsedRequest:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as error:  # invalid UTF-8 lands here too
        raise bad_request(f"The request body is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    stream = payload.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_request(f"'stream' must be a boolean, got {stream!r}", "stream")
    max_tokens = _max_tokens(payload, endpoint)
    if endpoint is Endpoint.CHAT:
        return ParsedRequest(
            endpoint, payload, model, bool(stream), max_tokens, messages=_messages(payload)
        )
    prompts, token_lengths = _prompts(payload)
    return ParsedRequest(
        endpoint,
        payload,
        model,
        bool(stream),
        max_tokens,
        prompts=prompts,
        token_prompt_lengths=token_lengths,
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
    names = ("max_completion_tokens", "max_tokens") if endpoint is Endpoint.CHAT else ()
    for name in names or ("max_tokens",):
        value = payload.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad_request(f"'{name}' must be a positive integer, got {value!r}", name)
        return value
    return None


def _messages(payload: Mapping[str, Any]) -> tuple[ChatMessage, ...]:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", "messages")
    parsed = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{param}' must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"'{param}.role' must be a non-empty string", f"{param}.role")
        parsed.append(ChatMessage(role, _content_text(message.get("content"), param)))
    return tuple(parsed)


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
