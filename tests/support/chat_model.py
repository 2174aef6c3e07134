"""A model's tokenizer files as vLLM or SGLang would serve them (laneway.bench.harness.tiny_model:
a small byte-level BPE with Llama-3-style special tokens and a chat template in the Llama 3
shape), and the chats the tests send."""

from __future__ import annotations

import orjson
from openai.types.chat import ChatCompletionMessageParam

from laneway.bench.harness.tiny_model import ModelFiles, write_model_files
from laneway.gateway.serving.request_body import Endpoint, ParsedRequest, parse_request

__all__ = ["ModelFiles", "write_model_files"]

MAX_TOKENS = 2


def user(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def chat_request(messages: list[ChatCompletionMessageParam]) -> ParsedRequest:
    body = {"model": "llama", "messages": messages, "max_tokens": MAX_TOKENS}
    return parse_request(orjson.dumps(body), Endpoint.CHAT)
