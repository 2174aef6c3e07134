"""A model's tokenizer files as vLLM or SGLang would serve them: a small byte-level BPE with
Llama-3-style special tokens (tokenizer.json) and a small chat template in the Llama 3 shape
(tokenizer_config.json: BOS, a default system block, a header per message, a generation
prompt, `raise_exception` on roles that do not alternate)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import orjson
from openai.types.chat import ChatCompletionMessageParam
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from laneway.gateway.serving.request_body import Endpoint, ParsedRequest, parse_request
from support.tiny_tokenizer import WORDS

SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system = 'You route lanes.' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system + '<|eot_id|>' }}"
    "{%- if tools is defined and tools is not none %}"
    "{{- '<|start_header_id|>tools<|end_header_id|>\\n\\n' + tools | tojson(indent=2) }}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


MAX_TOKENS = 2


@dataclass(frozen=True)
class ModelFiles:
    tokenizer: Path  # tokenizer.json
    config: Path  # tokenizer_config.json, with the chat template


def write_model_files(folder: Path) -> ModelFiles:
    rng = random.Random(7)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(300)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    # Llama 3's tokenizer.json puts a BOS before every text it encodes with special tokens:
    # a completion prompt's, not a rendered chat's (whose template writes its own).
    bos = SPECIALS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    files = ModelFiles(folder / "tokenizer.json", folder / "tokenizer_config.json")
    tokenizer.save(str(files.tokenizer))
    config = {
        "bos_token": "<|begin_of_text|>",
        # tokenizer_config.json writes special tokens as strings or as AddedToken objects.
        "eos_token": {"content": "<|eot_id|>", "special": True},
        "chat_template": TEMPLATE,
    }
    files.config.write_text(json.dumps(config))
    return files


def user(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def chat_request(messages: list[ChatCompletionMessageParam]) -> ParsedRequest:
    body = {"model": "llama", "messages": messages, "max_tokens": MAX_TOKENS}
    return parse_request(orjson.dumps(body), Endpoint.CHAT)
