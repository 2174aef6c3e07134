"""What an engine's non-streaming answer says it counted.

vLLM, SGLang and `laneway sim` put `usage.prompt_tokens` in every non-streaming completion:
the engine's own count of the prompt, the count lane edges and context caps are about. The
gateway takes it for the answer's `x-laneway-prompt-tokens` instead of counting the prompt a
second time. It is the request's total over its prompts (vLLM's serving_completion.py and
SGLang's `aggregate_token_usage` add each prompt once, however many choices `n` asks for), so
it stands for the gateway's count, the longest sequence's, only where there is one prompt.
A response (`/v1/responses`) names it `usage.input_tokens`.
"""

from __future__ import annotations

import orjson


def engine_prompt_tokens(answer: bytes) -> int | None:
    """`usage.prompt_tokens` of a JSON answer; None where it has none that is a count."""
    try:
        decoded = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    usage = decoded.get("usage") if isinstance(decoded, dict) else None
    count = None
    if isinstance(usage, dict):
        count = usage.get("prompt_tokens", usage.get("input_tokens"))
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    return count
