"""The body an engine gets: the client's fields that the OpenAI API and the engines'
sampling parameters define, the `model` renamed to the pool's served name, and `priority`
set by the gateway (`laneway.routing.priority`); an unstreamed request the gateway reads as
a stream (`whole_stream.py`) gets `stream: true` with `stream_options.include_usage`.

What is not on the allow-list is dropped, so a field that a client sends for another
service, or one a newer API version adds, costs it nothing; but a field that controls the
engine itself rather than the sampling of one request (`kv_transfer_params`, which points
an engine at another's KV cache, request ids, data-parallel ranks, adapter paths, custom
logits processors, hidden states...) is refused with 400 naming it, since a client that sends
one expects it to act, and it must not. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from laneway.gateway.errors import bad_request

# The OpenAI API's request fields for both completion endpoints.
_COMMON = frozenset(
    {
        *("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n"),
        *("stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user"),
        "seed",
    }
)
# Sampling parameters that vLLM (`SamplingParams`) and SGLang (`SamplingParams`) take in
# the same request body: they shape one request's output, nothing else.
_SAMPLING = frozenset(
    {
        *("top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "ignore_eos"),
        *("skip_special_tokens", "spaces_between_special_tokens", "stop_token_ids"),
        *("include_stop_str_in_output", "truncate_prompt_tokens", "prompt_logprobs"),
        *("guided_json", "guided_regex", "guided_choice", "guided_grammar"),
        *("structured_outputs", "regex", "ebnf", "json_schema", "no_stop_trim"),
        "priority",  # replaced by the gateway's (`engine_body`)
    }
)
FORWARDED: Mapping[str, frozenset[str]] = {
    "/v1/chat/completions": _COMMON
    | _SAMPLING
    | {
        *("messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice"),
        *("parallel_tool_calls", "response_format", "functions", "function_call"),
        *("reasoning_effort", "chat_template_kwargs", "add_generation_prompt"),
        *("continue_final_message", "echo", "documents"),
    },
    "/v1/completions": _COMMON
    | _SAMPLING
    | {"prompt", "suffix", "echo", "best_of", "add_special_tokens"},
    # The Responses API's create fields (vLLM's `ResponsesRequest` takes the sampling ones too).
    "/v1/responses": _SAMPLING
    | {
        *("model", "input", "instructions", "stream", "stream_options", "store"),
        *("previous_response_id", "max_output_tokens", "max_tool_calls", "temperature"),
        *("top_p", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"),
        *("reasoning", "text", "truncation", "include", "metadata", "background"),
        *("service_tier", "user", "prompt", "prompt_cache_key", "safety_identifier"),
        *("seed", "stop", "logit_bias"),
    },
}
# Fields that steer the engine rather than a request's sampling: refused, never forwarded.
ENGINE_CONTROL = frozenset(
    {
        # vLLM
        *("kv_transfer_params", "request_id", "data_parallel_rank", "vllm_xargs"),
        *("logits_processors", "prompt_embeds", "cache_salt"),
        # SGLang
        *("rid", "bootstrap_host", "bootstrap_port", "bootstrap_room", "lora_path"),
        *("custom_logit_processor", "return_hidden_states", "routed_dp_rank"),
    }
)


def refuse_engine_control(payload: Mapping[str, Any]) -> None:
    """ApiError 400 naming the first engine-control field the body holds."""
    if ENGINE_CONTROL.isdisjoint(payload):
        return
    field = min(ENGINE_CONTROL.intersection(payload))
    raise bad_request(
        f"'{field}' controls the engine, not the request, and is not accepted by this "
        "gateway; remove it",
        field,
    )


def engine_body(
    payload: Mapping[str, Any],
    path: str,
    body: bytes,
    served: str,
    priority: int | None,
    *,
    stream_whole: bool = False,
) -> bytes:
    """What the engine gets for `payload` (`body` as the client sent it): `body` itself
    where nothing changes, else the allowed fields with `model` and `priority` set, and
    asked as a stream with its usage where `stream_whole`."""
    allowed = FORWARDED[path]
    unchanged = (
        not stream_whole
        and payload.get("model") == served
        and payload.get("priority") == priority
        and allowed.issuperset(payload)
    )
    if unchanged:
        return body
    forwarded = {k: v for k, v in payload.items() if k in allowed and k != "priority"}
    forwarded["model"] = served
    if priority is not None:
        forwarded["priority"] = priority
    if stream_whole:
        forwarded["stream"] = True
        forwarded["stream_options"] = {"include_usage": True}
    return orjson.dumps(forwarded)
