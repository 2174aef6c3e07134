"""Small byte-level BPE tokenizers trained here with the `tokenizers` package, written as a
model's files, for the tests where the gateway must count as the engine's tokenizer does."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from laneway.bench.harness.tiny_model import WORDS

__all__ = ["WORDS"]


def train_tokenizer(path: Path) -> Path:
    rng = random.Random(7)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(300)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(path))
    return path


def prompts() -> list[str]:
    rng = random.Random(11)
    texts = [" ".join(rng.choice(WORDS) for _ in range(n)) for n in (1, 5, 20, 40, 60, 90)]
    # Words the tokenizer never saw, punctuation and non-ASCII: byte-level fallbacks.
    texts += ["Zebra-crossing, 42 times: überraschend!", "naïve café — 東京 🚀", "x" * 150]
    return texts
