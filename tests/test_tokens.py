"""Token bounds must hold for every text, or routing by bounds would pick the wrong lane."""

from __future__ import annotations

import random

import pytest

from laneway.errors import UsageError
from laneway.tokens import (
    ChatMessage,
    chat_bounds,
    count_chat,
    count_texts,
    default_tokenizer,
    load_tokenizer,
    texts_bounds,
)

ALPHABET = [
    *"abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789",
    *[" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n"],
    *".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
    *["é", "ü", "中文", "日本語", "🙂", "👍🏽", "\u00a0", "\u2003", "ß", "Ω", "'s", "'ll"],
]


def random_text(rng: random.Random, pieces: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(pieces))


def test_bounds_contain_the_exact_count_for_varied_text() -> None:
    tokenizer = default_tokenizer()
    rng = random.Random(7)
    edge_cases = ["", " ", "\n\n", "word", " word ", "\u3000全角\u3000", "a\u00a0b"]
    for text in edge_cases + [random_text(rng, rng.randint(0, 300)) for _ in range(400)]:
        bounds = tokenizer.bounds(text)
        count = tokenizer.count(text)
        assert bounds.low <= count <= bounds.high, text


def test_bounds_of_many_texts_contain_their_summed_count() -> None:
    tokenizer = default_tokenizer()
    rng = random.Random(11)
    for _ in range(100):
        texts = [random_text(rng, rng.randint(0, 60)) for _ in range(rng.randint(1, 20))]
        bounds = texts_bounds(tokenizer, texts)
        assert bounds.low <= count_texts(tokenizer, texts) <= bounds.high, texts


def test_a_run_without_spaces_cannot_hide_its_length() -> None:
    tokenizer = default_tokenizer()
    run = "x" * 1_000_000
    # Not one word but at least a token per 128 bytes: a 1 MB run cannot fit an 8k context.
    assert tokenizer.bounds(run).low >= 1_000_000 // 128


def test_bounds_are_tight_enough_to_decide_on_prose() -> None:
    tokenizer = default_tokenizer()
    prose = "The merchant qualification review covers every clause of the contract. " * 2000
    bounds = tokenizer.bounds(prose)
    count = tokenizer.count(prose)
    # Prose runs about 0.75 words per token: the lower bound is within 2x of the count.
    assert count / 2 < bounds.low <= count <= bounds.high


def test_chat_count_adds_framing_per_message() -> None:
    tokenizer = default_tokenizer()
    one = [ChatMessage("user", "hello there")]
    two = [ChatMessage("system", "be brief"), ChatMessage("user", "hello there")]
    assert count_chat(tokenizer, one) == 3 + 3 + 1 + tokenizer.count("hello there")
    assert count_chat(tokenizer, two) > count_chat(tokenizer, one)
    bounds = chat_bounds(tokenizer, two)
    assert bounds.low <= count_chat(tokenizer, two) <= bounds.high


def test_unknown_tokenizer_kind_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown tokenizer kind"):
        load_tokenizer("sentencepiece")
    with pytest.raises(UsageError, match="needs a path"):
        load_tokenizer("huggingface")
    with pytest.raises(UsageError, match="not available offline"):
        load_tokenizer("tiktoken", encoding="no_such_encoding")
