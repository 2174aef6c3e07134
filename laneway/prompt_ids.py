"""The token ids a simulated engine sees for a request's prompt, for its prefix cache; the
gateway renders prompts the same way to match them against the engine's KV events.

A real engine renders a chat through its chat template and tokenizes the result; the
simulator's chat template is the one `laneway.tokens.count_chat` counts (every message
costs its role, its content and TOKENS_PER_MESSAGE tokens of framing; the reply is primed
with TOKENS_REPLY_PRIMING more), so `len(chat_token_ids(...)) == count_chat(...)` and a chat
that resends its history with a new message extends the previous prompt's ids, as it does
in vLLM. The framing tokens get negative ids: no text encodes to them, and the prefix cache
only hashes ids, so they need no vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.tokens import TOKENS_PER_MESSAGE, TOKENS_REPLY_PRIMING, ChatMessage, Tokenizer

MESSAGE_START, ROLE_END, MESSAGE_END, ASSISTANT = -1, -2, -3, -4
_MESSAGE_FRAMING = (MESSAGE_START, ROLE_END, MESSAGE_END)
_REPLY_PRIMING = (MESSAGE_START, ASSISTANT, ROLE_END)
assert len(_MESSAGE_FRAMING) == TOKENS_PER_MESSAGE
assert len(_REPLY_PRIMING) == TOKENS_REPLY_PRIMING


def chat_token_ids(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> list[int]:
    ids: list[int] = []
    for message in messages:
        ids.append(MESSAGE_START)
        ids.extend(tokenizer.encode(message.role))
        ids.append(ROLE_END)
        ids.extend(tokenizer.encode(message.content))
        ids.append(MESSAGE_END)
    ids.extend(_REPLY_PRIMING)
    return ids
