"""A whole answer put together from an engine's stream (`whole_stream.py`): chunks shaped as
vLLM streams them, split anywhere by the transport, give the answer the engine gives
unstreamed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from laneway.api import Lane
from laneway.gateway.serving.engine_body import engine_body
from laneway.gateway.serving.request_body import Endpoint, parse_request
from laneway.gateway.serving.whole_stream import StreamIncomplete, WholeAnswer, streams_whole

ENVELOPE = {"id": "chatcmpl-1", "created": 1700, "model": "served"}


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    lines = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return b"".join(lines) + (b"data: [DONE]\n\n" if done else b"")


def chat_chunk(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**ENVELOPE, "object": "chat.completion.chunk", "choices": list(choices), **extra}


def text_chunk(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**ENVELOPE, "object": "text_completion", "choices": list(choices), **extra}


USAGE = {
    "prompt_tokens": 7,
    "completion_tokens": 3,
    "total_tokens": 10,
    "prompt_tokens_details": {"cached_tokens": 4},
}


def assembled(endpoint: Endpoint, stream: bytes, split: int = 0) -> tuple[int, Any]:
    """The answer, the stream fed whole, or in pieces of `split` bytes."""
    answer = WholeAnswer(endpoint)
    pieces = [stream[i : i + split] for i in range(0, len(stream), split)] if split else [stream]
    for piece in pieces:
        answer.feed(piece)
    result = answer.result()
    return result.status, json.loads(result.body)


@pytest.mark.parametrize("split", [0, 1, 7])
def test_a_chat_stream_becomes_the_chat_completion(split: int) -> None:
    delta = {"role": "assistant", "content": ""}
    stream = sse(
        chat_chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}),
        chat_chunk({"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}),
        chat_chunk(
            {"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop", "stop_reason": None}
        ),
        chat_chunk(usage=USAGE),
    )
    status, body = assembled(Endpoint.CHAT, stream, split)
    assert status == 200
    assert body == {
        **ENVELOPE,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": USAGE,
    }


def test_tool_calls_split_across_chunks_merge_by_index() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return {"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]}}

    stream = sse(
        chat_chunk({"index": 0, "delta": {"role": "assistant"}}),
        chat_chunk(call(0, id="call_a", type="function", function={"name": "get_"})),
        chat_chunk(call(0, function={"name": "weather", "arguments": '{"ci'})),
        chat_chunk(call(1, id="call_b", type="function", function={"name": "now"})),
        chat_chunk(call(0, function={"arguments": 'ty": "Oslo"}'})),
        chat_chunk(call(1, function={"arguments": "{}"})),
        chat_chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
    )
    _, body = assembled(Endpoint.CHAT, stream, 5)
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]  # fmt: skip
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_two_choices_reasoning_and_logprobs_stay_apart() -> None:
    def token(index: int, text: str, logprob: float) -> dict[str, Any]:
        entry = {"token": text, "logprob": logprob, "bytes": None, "top_logprobs": []}
        return {"index": index, "delta": {"content": text}, "logprobs": {"content": [entry]}}

    stream = sse(
        chat_chunk({"index": 1, "delta": {"role": "assistant", "reasoning_content": "hm"}}),
        chat_chunk({"index": 0, "delta": {"role": "assistant", "reasoning_content": "so"}}),
        chat_chunk(token(0, "a", -0.1), token(1, "x", -0.2)),
        chat_chunk(token(1, "y", -0.3)),
        chat_chunk(token(0, "b", -0.4)),
        chat_chunk({"index": 1, "delta": {}, "finish_reason": "length"}),
        chat_chunk({"index": 0, "delta": {}, "finish_reason": "stop"}),
        chat_chunk(usage=USAGE),
    )
    _, body = assembled(Endpoint.CHAT, stream, 3)
    first, second = body["choices"]
    assert (first["index"], second["index"]) == (0, 1)
    assert first["message"] == {"role": "assistant", "content": "ab", "reasoning_content": "so"}
    assert second["message"] == {"role": "assistant", "content": "xy", "reasoning_content": "hm"}
    assert [e["token"] for e in first["logprobs"]["content"]] == ["a", "b"]
    assert [e["logprob"] for e in second["logprobs"]["content"]] == [-0.2, -0.3]
    assert (first["finish_reason"], second["finish_reason"]) == ("stop", "length")
    assert body["usage"] == USAGE


def test_a_completion_stream_concatenates_text_and_logprobs_lists() -> None:
    def token(text: str, offset: int) -> dict[str, Any]:
        logprobs = {"text_offset": [offset], "token_logprobs": [-1.0], "tokens": [text],
                    "top_logprobs": [{text: -1.0}]}  # fmt: skip
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None,
                "stop_reason": None}  # fmt: skip

    last = {**token(" c", 4), "finish_reason": "length"}
    stream = sse(
        text_chunk(token(" a", 0)),
        text_chunk(token(" b", 2)),
        text_chunk(last),
        text_chunk(usage=USAGE),
    )
    status, body = assembled(Endpoint.COMPLETIONS, stream, 11)
    assert status == 200
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == " a b c"
    assert choice["logprobs"] == {
        "text_offset": [0, 2, 4],
        "token_logprobs": [-1.0, -1.0, -1.0],
        "tokens": [" a", " b", " c"],
        "top_logprobs": [{" a": -1.0}, {" b": -1.0}, {" c": -1.0}],
    }
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_an_error_event_mid_stream_is_the_unstreamed_error() -> None:
    error = {"error": {"message": "out of memory", "type": "InternalServerError",
                       "param": None, "code": 500}}  # fmt: skip
    stream = sse(chat_chunk({"index": 0, "delta": {"content": "a"}}), error)
    status, body = assembled(Endpoint.CHAT, stream)
    assert (status, body) == (500, error)
    bad = {"error": {"message": "bad", "type": "BadRequestError", "param": "x", "code": 400}}
    assert assembled(Endpoint.COMPLETIONS, sse(bad, done=False)) == (400, bad)
    no_code = {"error": {"message": "?"}}
    assert assembled(Endpoint.CHAT, sse(no_code, done=False))[0] == 500


def test_a_stream_cut_before_its_end_makes_no_answer() -> None:
    answer = WholeAnswer(Endpoint.CHAT)
    answer.feed(sse(chat_chunk({"index": 0, "delta": {"content": "a"}}), done=False))
    with pytest.raises(StreamIncomplete):
        answer.result()


def test_the_end_marker_without_a_final_newline_ends_it() -> None:
    stream = sse(chat_chunk({"index": 0, "delta": {"content": "a"}}), done=False)
    answer = WholeAnswer(Endpoint.CHAT)
    answer.feed(stream + b"data: [DONE]")
    assert json.loads(answer.result().body)["choices"][0]["message"]["content"] == "a"


def parsed(path: str, **fields: Any) -> Any:
    body = {"model": "m", **fields}
    if path == "/v1/responses":
        body["input"] = "hi"
    elif path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return parse_request(json.dumps(body).encode(), Endpoint(path))


def test_which_requests_are_read_as_streams() -> None:
    def batch(path: str, **fields: Any) -> bool:
        return streams_whole(parsed(path, **fields), Lane.BATCH)

    assert batch("/v1/chat/completions")
    assert batch("/v1/completions", stream=False, n=2, logprobs=2)
    assert batch("/v1/completions", echo=False)
    # Interactive, streamed already, a response, or a whole answer a stream does not carry
    # the same way.
    assert not streams_whole(parsed("/v1/chat/completions"), Lane.INTERACTIVE)
    assert not batch("/v1/chat/completions", stream=True)
    assert not batch("/v1/responses")
    assert not batch("/v1/completions", echo=True)
    assert not batch("/v1/completions", best_of=3)
    assert not batch("/v1/chat/completions", prompt_logprobs=1)


def test_the_engine_is_asked_for_a_stream_with_its_usage() -> None:
    payload = {"model": "m", "prompt": "hi", "stream": False, "stream_options": None}
    sent = json.loads(
        engine_body(payload, "/v1/completions", b"", "served", None, stream_whole=True)
    )
    assert sent == {
        "model": "served",
        "prompt": "hi",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
