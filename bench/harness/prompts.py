"""Prompt text of an exact token length, for the tokenizer the gateway and engines use."""

from __future__ import annotations

import random

from laneway.tokens import ChatMessage, Tokenizer, count_chat

# Common English words; those that are one token with a leading space make prompts of an
# exact length without counting them word by word.
_COMMON_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "if so no will can more other what time up out about into than them only some could "
    "new these two may first then do any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three order price review contract clause report summary customer search answer question"
)
COMMON_WORDS = tuple(_COMMON_TEXT.split())


class PromptFactory:
    """Text that is exactly N tokens long for the tokenizer the gateway and engines use."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._words = tuple(
            w
            for w in COMMON_WORDS
            if len(tokenizer.encode(w)) == 1 and len(tokenizer.encode(f" {w}")) == 1
        )
        if len(self._words) < 16:
            raise ValueError(f"tokenizer {tokenizer.name} splits too many common words")
        self._chat_overhead = count_chat(tokenizer, [ChatMessage(role="user", content="")])

    def text(self, rng: random.Random, tokens: int) -> str:
        text = " ".join(rng.choices(self._words, k=tokens))
        # Words that are one token each with their space never merge across a space, but
        # the check keeps that promise honest for any tokenizer.
        count = self._tokenizer.count(text)
        if count != tokens:
            raise ValueError(f"{self._tokenizer.name}: wanted {tokens} tokens, made {count}")
        return text

    def chat_content(self, rng: random.Random, prompt_tokens: int) -> str:
        """A user message whose whole chat prompt counts `prompt_tokens` (at least the framing)."""
        return self.text(rng, max(prompt_tokens - self._chat_overhead, 1))

    def chat_prompt_tokens(self, prompt_tokens: int) -> int:
        """What `chat_content(rng, prompt_tokens)` really counts as a chat prompt."""
        return max(prompt_tokens - self._chat_overhead, 1) + self._chat_overhead
