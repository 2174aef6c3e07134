"""A tiny Llama-shaped model written on the spot, for real vLLM on the CPU (the tests' `vllm`
tier and `laneway demo --engine vllm`): no download and no weights file.

`config.json` gives the shape (LlamaForCausalLM, hidden 256, 2 layers, 4 heads, 2 KV heads);
`vllm serve --load-format dummy` fills the weights with random values. The tokenizer is a
small byte-level BPE trained here in seconds (tokenizer.json, Llama-3-style special tokens)
and tokenizer_config.json carries a chat template in the Llama 3 shape (BOS, a default
system block, a header per message, a generation prompt, `raise_exception` on roles that do
not alternate). What the model says is noise; what the engine does with it (scheduling,
caching, metrics, events, framing) is the engine's own.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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

# The words the tests' tokenizer is trained on.
WORDS = ("lane", "gateway", "engine", "prompt", "token", "batch", "chunk", "prefill", "decode",
         "router", "pool")  # fmt: skip


@dataclass(frozen=True)
class ModelFiles:
    tokenizer: Path  # tokenizer.json
    config: Path  # tokenizer_config.json, with the chat template


def write_model_files(
    folder: Path, words: Sequence[str] = WORDS, vocab_size: int = 400
) -> ModelFiles:
    """A byte-level BPE trained on lines of `words` (each word alone too, so that with a
    large enough vocabulary every word is one token with and without its leading space)."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    except ImportError:
        from laneway.errors import UsageError

        raise UsageError(
            "the tiny model's tokenizer needs the 'tokenizers' package: "
            "pip install 'laneway[tokenizers]'"
        ) from None
    rng = random.Random(7)
    corpus = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(300)]
    if words != WORDS:  # the tests' tokenizer stays as their counts were written for
        corpus += [word for word in words for _ in range(2)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
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
    folder.mkdir(parents=True, exist_ok=True)
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


@dataclass(frozen=True)
class TinyModel:
    folder: Path  # what `vllm serve` loads: config.json and the tokenizer's files
    files: ModelFiles  # the tokenizer.json and tokenizer_config.json the gateway reads


def write_tiny_model(
    folder: Path, max_model_len: int, words: Sequence[str] = WORDS, vocab_size: int = 400
) -> TinyModel:
    files = write_model_files(folder, words, vocab_size)
    vocab = json.loads(files.tokenizer.read_text())["model"]["vocab"]
    # transformers picks the fast tokenizer class from here; without it a Llama config
    # would make it LlamaTokenizerFast, which rewrites the post-processor (BOS) its own way.
    # The EOS as a plain string: transformers 5 refuses a special token written as an
    # object without its "__type" (the gateway's own reader takes either).
    config = json.loads(files.config.read_text())
    config |= {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|eot_id|>"}
    files.config.write_text(json.dumps(config))
    shape = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": max_model_len,
        "vocab_size": len(vocab),
        "bos_token_id": vocab["<|begin_of_text|>"],
        "eos_token_id": vocab["<|eot_id|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(shape))
    return TinyModel(folder=folder, files=files)
