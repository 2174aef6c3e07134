"""The simulator's OpenAI framing: request bodies parsed as vLLM parses them, the answers
(whole and streamed chunks) in OpenAI's shape, and errors in vLLM's shape.

Nothing here serves HTTP (server.py does); prompts are counted with the engine's tokenizer,
long ones in a worker thread so that the server's loop keeps stepping the engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiohttp import web

from laneway.prompt_ids import chat_token_ids
from laneway.simulator.prefix_cache import block_hashes
from laneway.simulator.realtime import TokenEvent
from laneway.simulator.scheduler import KV_BLOCK_TOKENS
from laneway.tokens import ChatMessage, ChatTemplateError, Tokenizer, template_chat

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 256  # vLLM fills the context; a simulator should end sooner
T = TypeVar("T")

OFF_LOOP_CHARS = 16_384  # prompts longer than this are tokenized (and hashed) in a thread
OUTPUT_WORDS = (" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing")

ApiRoute = Literal["completions", "chat", "responses"]


class OpenAIError(Exception):
    """Turned into vLLM's error JSON by the middleware."""

    def __init__(
        self, status: int, message: str, param: str | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type  # where vLLM names one; else by status


# The error "type" vLLM's server sends (the exception's name), not OpenAI's types.
VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
               413: "RequestEntityTooLarge", 500: "InternalServerError"}  # fmt: skip


def error_response(
    status: int, message: str, param: str | None = None, error_type: str | None = None
) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": error_type or VLLM_ERROR_TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
    }
    return web.json_response(body, status=status)


# -- request parsing ---------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: ApiRoute
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int = 0  # vLLM's extra request field; lower is more urgent
    # The prompt's token ids in prefix-cache blocks (prefix_cache.block_hashes): what lets
    # a repeated prefix skip its prefill, as automatic prefix caching does.
    block_hashes: tuple[int, ...] = ()
    token_ids: Sequence[int] = ()  # the prompt's, for KV events


def priority_of(body: dict[str, Any]) -> int:
    value = body.get("priority", 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError(400, f"'priority' must be an integer, got {value!r}", "priority")
    return value


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OpenAIError(400, f"'{name}' must be an integer of at least 1, got {value!r}", name)
    return value


def flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OpenAIError(400, f"'{name}' must be true or false, got {value!r}", name)
    return value


def _completion_prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    raise OpenAIError(
        400, "'prompt' must be a string, a list of one string, or a list of token ids", "prompt"
    )


def _message_text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):  # fmt: skip
                raise OpenAIError(
                    400, f"messages[{index}].content: only text parts are supported", "messages"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise OpenAIError(400, f"messages[{index}].content must be a string or a list of parts",
                      "messages")  # fmt: skip


def chat_messages(body: dict[str, Any]) -> list[ChatMessage]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "'messages' must be a non-empty list", "messages")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(
                400, f"messages[{index}] must be an object with a string 'role'", "messages"
            )
        parsed.append(ChatMessage(message["role"], _message_text(message.get("content"), index)))
    return parsed


def chat_ids(
    tokenizer: Tokenizer,
    body: dict[str, Any],
    messages: Sequence[ChatMessage],
    *,
    prompt_specials: bool = False,
) -> list[int]:
    """A chat's prompt ids: the model's chat template rendered and tokenized where the engine
    has one (as vLLM and SGLang do), else the simulator's own framing (prompt_ids.py).
    `prompt_specials`: tokenized as a prompt is, with the tokenizer's BOS besides the
    template's, as vLLM tokenizes a response's chat (laneway.gateway.serving.request_body's
    `rendered_specials` cites it)."""
    template = tokenizer.chat_template
    if template is None:
        return chat_token_ids(tokenizer, messages)
    tools = body.get("tools")
    try:
        chat = template_chat(
            body["messages"],
            [m.content for m in messages],
            tools if isinstance(tools, list) else None,
        )
        rendered = template.render(chat)
        return tokenizer.encode_prompt(rendered) if prompt_specials else tokenizer.encode(rendered)
    except ChatTemplateError as error:
        raise OpenAIError(400, str(error), "messages") from None


@dataclass(frozen=True)
class PromptTokens:
    count: int
    block_hashes: tuple[int, ...]
    ids: Sequence[int]


def prompt_tokens_of(ids: Sequence[int]) -> PromptTokens:
    return PromptTokens(count=len(ids), block_hashes=block_hashes(ids, KV_BLOCK_TOKENS), ids=ids)


async def off_loop(length: int, count: Callable[[], T]) -> T:
    """Count on the loop when cheap, in a worker thread when a long prompt would stall it."""
    if length > OFF_LOOP_CHARS:
        return await asyncio.to_thread(count)
    return count()


async def parse_generation(
    raw: bytes, endpoint: ApiRoute, model_name: str, max_context: int, tokenizer: Tokenizer
) -> GenerationRequest:
    """A completion or chat request for the model served as `model_name`; OpenAIError when
    the body is wrong, with vLLM's status and message."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OpenAIError(400, f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(400, "'model' must be a string", "model")
    if model != model_name:
        raise OpenAIError(404, f"The model `{model}` does not exist.", "model")
    n = body.get("n", 1)
    if n not in (None, 1) or isinstance(n, bool):
        raise OpenAIError(400, "'n' must be 1: the simulator returns one choice", "n")
    stream = flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise OpenAIError(400, "'stream_options' must be an object", "stream_options")
    include_usage = flag(options, "include_usage")

    if endpoint == "completions":
        prompt = _completion_prompt(body)
        if isinstance(prompt, list):
            tokens = prompt_tokens_of(prompt)
        else:
            text = prompt
            tokens = await off_loop(
                len(text), lambda: prompt_tokens_of(tokenizer.encode_prompt(text))
            )
        max_tokens = positive_int(body, "max_tokens") or COMPLETIONS_DEFAULT_MAX_TOKENS
    else:
        messages = chat_messages(body)
        length = sum(len(m.content) for m in messages)
        tokens = await off_loop(
            length, lambda: prompt_tokens_of(chat_ids(tokenizer, body, messages))
        )
        max_tokens = (
            positive_int(body, "max_completion_tokens")
            or positive_int(body, "max_tokens")
            or max(1, min(CHAT_DEFAULT_MAX_TOKENS, max_context - tokens.count))
        )
    return GenerationRequest(
        endpoint=endpoint,
        prompt_tokens=max(1, tokens.count),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        priority=priority_of(body),
        block_hashes=tokens.block_hashes,
        token_ids=tokens.ids,
    )


# -- responses ---------------------------------------------------------------------------


def _usage(parsed: GenerationRequest, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """vLLM's usage with --enable-prompt-tokens-details: how many prompt tokens the prefix
    cache held is reported, 0 included (`_make_prompt_tokens_details` in vLLM's
    entrypoints/openai/chat_completion/serving.py; completion/serving.py the same)."""
    return {
        "prompt_tokens": parsed.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": parsed.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def output_word(index: int) -> str:
    return OUTPUT_WORDS[index % len(OUTPUT_WORDS)]


@dataclass(frozen=True)
class Reply:
    request_id: str
    created: int
    model: str
    parsed: GenerationRequest

    def envelope(self, chunk: bool) -> dict[str, Any]:
        if self.parsed.endpoint == "completions":
            kind = "text_completion"
        else:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def token_chunk(self, event: TokenEvent) -> dict[str, Any]:
        # Every choice, streamed or whole, has vLLM's `stop_reason` (its choice models in
        # entrypoints/openai/chat_completion/protocol.py and completion/protocol.py).
        finish = "length" if event.last else None
        if self.parsed.endpoint == "completions":
            choice = {"index": 0, "text": output_word(event.index), "logprobs": None,
                      "finish_reason": finish, "stop_reason": None}  # fmt: skip
        else:
            choice = {"index": 0, "delta": {"content": output_word(event.index)}, "logprobs": None,
                      "finish_reason": finish, "stop_reason": None}  # fmt: skip
        return {**self.envelope(True), "choices": [choice]}

    def role_chunk(self) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                  "stop_reason": None}  # fmt: skip
        return {**self.envelope(True), "choices": [choice]}

    def usage_chunk(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return {
            **self.envelope(True),
            "choices": [],
            "usage": _usage(self.parsed, completion_tokens, cached_tokens),
        }

    def whole(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        text = "".join(output_word(i) for i in range(completion_tokens))
        if self.parsed.endpoint == "completions":
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                      "finish_reason": "length", "stop_reason": None}  # fmt: skip
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length", "stop_reason": None}  # fmt: skip
        return {**self.envelope(False), "choices": [choice],
                "usage": _usage(self.parsed, completion_tokens, cached_tokens)}  # fmt: skip
