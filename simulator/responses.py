"""The simulator's Responses API (`/v1/responses`), framed as vLLM frames it.

From vLLM's `OpenAIServingResponses` (vllm/entrypoints/openai/serving_responses.py) and its
router (vllm/entrypoints/openai/responses/api_router.py):
- The prompt is the chat of `instructions`, the previous response's history (without its
  system messages: instructions do not carry over) and the new input
  (laneway/responses_input.py), rendered as a chat completion's.
- `store` (OpenAI's default true) keeps the response only where the store is enabled
  (vLLM: `VLLM_ENABLE_RESPONSES_API_STORE=1`; here `--enable-responses-store`); otherwise
  it is silently ignored and the answer says `store: false`. The store is memory: it lasts
  as long as the engine's process, never expiring.
- `previous_response_id` that the store does not hold: 404 `invalid_request_error`,
  "Response with id '...' not found." (`_make_not_found_error`); so do GET and cancel.
- Cancel applies to background responses only; a finished one is
  "Cannot cancel a synchronous response." (400). Background mode is not simulated.
- A stream is named SSE events, `event: TYPE` then `data: JSON` (`_convert_stream_to_sse_
  events`), numbered by `sequence_number`: response.created, response.in_progress,
  response.output_item.added, response.content_part.added, one response.output_text.delta
  per token, response.output_text.done, response.content_part.done,
  response.output_item.done, response.completed (with the usage); no `[DONE]`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from laneway.responses_input import ResponsesInputError, responses_chat
from laneway.simulator.openai_framing import (
    CHAT_DEFAULT_MAX_TOKENS,
    GenerationRequest,
    OpenAIError,
    chat_ids,
    chat_messages,
    flag,
    off_loop,
    output_word,
    positive_int,
    priority_of,
    prompt_tokens_of,
)
from laneway.tokens import Tokenizer

NOT_FOUND_TYPE = "invalid_request_error"


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(
        404, f"Response with id '{response_id}' not found.", None, error_type=NOT_FOUND_TYPE
    )


@dataclass
class Stored:
    response: dict[str, Any]  # the whole answer, as GET returns it
    messages: list[dict[str, Any]]  # the chat it was made from: the next turn's history


@dataclass
class ResponseStore:
    """The engine's store: memory, for the life of the process (vLLM's `response_store`
    and `msg_store` dicts)."""

    enabled: bool
    held: dict[str, Stored] = field(default_factory=dict)

    def get(self, response_id: str) -> Stored:
        stored = self.held.get(response_id)
        if stored is None:
            raise not_found(response_id)
        return stored


@dataclass(frozen=True)
class ResponsesRequest:
    generation: GenerationRequest
    body: dict[str, Any]
    messages: list[dict[str, Any]]  # the rendered chat: history and the new input
    store: bool  # as the answer says it: false where the store is disabled
    previous: str | None


async def parse_responses(
    raw: bytes, model_name: str, max_context: int, tokenizer: Tokenizer, store: ResponseStore
) -> ResponsesRequest:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OpenAIError(400, f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    model = body.get("model")
    if model != model_name:
        raise OpenAIError(404, f"The model `{model}` does not exist.", "model")
    wants_store = flag(body, "store", default=True)
    if flag(body, "background"):
        if not (wants_store and store.enabled):
            raise OpenAIError(
                400,
                "This vLLM engine does not support `store=True` and therefore does not "
                "support the background mode. To enable these features, set the environment "
                "variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
            )
        raise OpenAIError(400, "laneway sim does not simulate background responses", "background")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise OpenAIError(400, "'previous_response_id' must be a string", "previous_response_id")
    # vLLM drops the previous turns' system messages: instructions do not carry over
    # (`construct_input_messages`, vllm/entrypoints/openai/responses/utils.py, "per the
    # OpenAI spec, instructions should NOT carry over across responses").
    history = [
        message
        for message in (store.get(previous).messages if previous is not None else [])
        if message.get("role") != "system"
    ]
    try:
        chat = responses_chat(body)
    except ResponsesInputError as error:
        raise OpenAIError(400, str(error), error.param) from None
    # vLLM: instructions first, then the history, then the new input.
    system = [m for m in chat.messages[:1] if body.get("instructions")]
    messages = system + history + list(chat.messages[len(system) :])
    framed = {"messages": messages, "tools": list(chat.tools) if chat.tools else None}
    parsed = chat_messages(framed)
    length = sum(len(m.content) for m in parsed)
    tokens = await off_loop(
        length,
        lambda: prompt_tokens_of(chat_ids(tokenizer, framed, parsed, prompt_specials=True)),
    )
    max_tokens = positive_int(body, "max_output_tokens") or max(
        1, min(CHAT_DEFAULT_MAX_TOKENS, max_context - tokens.count)
    )
    generation = GenerationRequest(
        endpoint="responses",
        prompt_tokens=max(1, tokens.count),
        max_tokens=max_tokens,
        stream=flag(body, "stream"),
        include_usage=True,
        priority=priority_of(body),
        block_hashes=tokens.block_hashes,
        token_ids=tokens.ids,
    )
    return ResponsesRequest(
        generation=generation,
        body=body,
        messages=messages,
        store=wants_store and store.enabled,
        previous=previous,
    )


@dataclass(frozen=True)
class ResponseReply:
    """One response's answer and events; `response_id` as vLLM makes it (`resp_` + hex)."""

    request: ResponsesRequest
    model: str
    created: int
    response_id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    item_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")

    def response(self, status: str, output_tokens: int | None) -> dict[str, Any]:
        body, generation = self.request.body, self.request.generation
        output: list[dict[str, Any]] = []
        usage = None
        if output_tokens is not None:
            text = "".join(output_word(i) for i in range(output_tokens))
            output = [self.message(text, "completed")]
            usage = {
                "input_tokens": generation.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": generation.prompt_tokens + output_tokens,
            }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": body.get("instructions"),
            "max_output_tokens": generation.max_tokens,
            "metadata": body.get("metadata"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": self.request.previous,
            "store": self.request.store,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": usage,
            "user": body.get("user"),
        }

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.item_id, "type": "message", "role": "assistant",
                "status": status, "content": content if text else []}  # fmt: skip

    def opening(self) -> list[dict[str, Any]]:
        """The events before the first token (sequence numbers from 0)."""
        started = self.response("in_progress", None)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
            {"type": "response.output_item.added", "output_index": 0,
             "item": self.message("", "in_progress")},
            {"type": "response.content_part.added", "output_index": 0, "item_id": self.item_id,
             "content_index": 0, "part": part},
        ]  # fmt: skip

    def delta(self, index: int) -> dict[str, Any]:
        return {"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
                "item_id": self.item_id, "delta": output_word(index), "logprobs": []}  # fmt: skip

    def closing(self, output_tokens: int) -> list[dict[str, Any]]:
        # Every simulated request runs to its max_output_tokens, which vLLM calls
        # "incomplete" (finish reason `length`, ResponsesResponse.from_request gives the
        # reason), in a stream's `response.completed` event too.
        final = self.response("incomplete", output_tokens)
        text = "".join(output_word(i) for i in range(output_tokens))
        part = {"type": "output_text", "text": text, "annotations": []}
        return [
            {"type": "response.output_text.done", "output_index": 0, "content_index": 0,
             "item_id": self.item_id, "text": text, "logprobs": []},
            {"type": "response.content_part.done", "output_index": 0, "content_index": 0,
             "item_id": self.item_id, "part": part},
            {"type": "response.output_item.done", "output_index": 0,
             "item": self.message(text, "completed")},
            {"type": "response.completed", "response": final},
        ]  # fmt: skip

    def kept(self, answer: dict[str, Any]) -> Stored:
        """What the store keeps of a finished response: it, and the chat the next turn
        continues (the output as an assistant message, as vLLM appends it)."""
        text = "".join(part["text"] for item in answer["output"] for part in item["content"])
        history = [*self.request.messages, {"role": "assistant", "content": text}]
        return Stored(response=answer, messages=history)


def sse_event(event: dict[str, Any], sequence_number: int) -> bytes:
    """One named SSE event as vLLM writes it."""
    data = json.dumps({**event, "sequence_number": sequence_number}, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
