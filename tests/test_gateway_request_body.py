"""Request bodies: the fields routing needs are checked and named; the rest passes through."""

from __future__ import annotations

import json
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneway.api import Lane
from laneway.gateway.errors import ApiError
from laneway.gateway.serving.request_body import Endpoint, json_values, parse_lane, parse_request
from laneway.tokens import ChatMessage, default_tokenizer


def body(value: object) -> bytes:
    return json.dumps(value).encode()


CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}

BAD = [
    # (case, endpoint, raw body, the param the error names)
    ("not JSON", Endpoint.CHAT, b"{nope", None),
    ("not UTF-8", Endpoint.CHAT, b"\xff\xfe{}", None),
    ("a JSON list", Endpoint.CHAT, body([1, 2]), None),
    ("no model", Endpoint.CHAT, body({"messages": CHAT["messages"]}), "model"),
    ("model a number", Endpoint.CHAT, body({**CHAT, "model": 7}), "model"),
    ("stream a string", Endpoint.CHAT, body({**CHAT, "stream": "yes"}), "stream"),
    ("max_tokens negative", Endpoint.CHAT, body({**CHAT, "max_tokens": -1}), "max_tokens"),
    (
        "max_tokens a boolean",
        Endpoint.COMPLETIONS,
        body({"model": "m", "prompt": "x", "max_tokens": True}),
        "max_tokens",
    ),
    ("messages empty", Endpoint.CHAT, body({**CHAT, "messages": []}), "messages"),
    ("a message not an object", Endpoint.CHAT, body({**CHAT, "messages": ["hi"]}), "messages[0]"),
    (
        "a role missing",
        Endpoint.CHAT,
        body({**CHAT, "messages": [{"content": "x"}]}),
        "messages[0].role",
    ),
    (
        "content a number",
        Endpoint.CHAT,
        body({**CHAT, "messages": [{"role": "user", "content": 5}]}),
        "messages[0].content",
    ),
    (
        "a part without type",
        Endpoint.CHAT,
        body({**CHAT, "messages": [{"role": "user", "content": [{}]}]}),
        "messages[0].content",
    ),
    ("no prompt", Endpoint.COMPLETIONS, body({"model": "m"}), "prompt"),
    (
        "prompt of mixed items",
        Endpoint.COMPLETIONS,
        body({"model": "m", "prompt": ["a", 1]}),
        "prompt",
    ),
    ("negative token ids", Endpoint.COMPLETIONS, body({"model": "m", "prompt": [1, -2]}), "prompt"),
    ("nested past the recursion limit", Endpoint.CHAT, b"[" * 20_000 + b"]" * 20_000, None),
    (
        "nested deeper than the gateway forwards",
        Endpoint.CHAT,
        body({**CHAT, "x": json.loads("[" * 200 + "]" * 200)}),
        None,
    ),
    (
        "an integer of 5000 digits",
        Endpoint.CHAT,
        b'{"model": "m", "n": ' + b"9" * 5000 + b"}",
        None,
    ),
    ("n zero", Endpoint.CHAT, body({**CHAT, "n": 0}), "n"),
    ("tools not a list", Endpoint.CHAT, body({**CHAT, "tools": {"a": 1}}), "tools"),
    (
        "a name not a string",
        Endpoint.CHAT,
        body({**CHAT, "messages": [{"role": "user", "content": "x", "name": 3}]}),
        "messages[0].name",
    ),
    (
        "tool call arguments not a string",
        Endpoint.CHAT,
        body(
            {
                **CHAT,
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}
                ],
            }
        ),
        "messages[0].tool_calls",
    ),
    (
        "suffix a number",
        Endpoint.COMPLETIONS,
        body({"model": "m", "prompt": "x", "suffix": 1}),
        "suffix",
    ),
]


@pytest.mark.parametrize(
    ("endpoint", "raw", "param"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_bad_bodies_are_400_naming_the_field(
    endpoint: Endpoint, raw: bytes, param: str | None
) -> None:
    with pytest.raises(ApiError) as error:
        parse_request(raw, endpoint)
    assert error.value.status == 400
    assert error.value.param == param
    assert error.value.body()["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_chat_keeps_the_payload_and_reads_text_parts() -> None:
    payload = {
        **CHAT,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
            {"role": "assistant", "content": None, "tool_calls": []},
        ],
        "max_completion_tokens": 20,
        "temperature": 0.2,
        "stream": True,
    }
    parsed = parse_request(body(payload), Endpoint.CHAT)
    assert parsed.messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("user", "a"),
        ChatMessage("assistant", ""),
    )
    assert (parsed.max_tokens, parsed.stream) == (20, True)
    assert parsed.payload == payload


def test_completion_prompts_count_the_longest() -> None:
    tokenizer = default_tokenizer()
    texts = parse_request(
        body({"model": "m", "prompt": ["a b", "a b c d e"]}), Endpoint.COMPLETIONS
    )
    assert texts.count(tokenizer) == tokenizer.count("a b c d e")
    bounds = texts.bounds(tokenizer)
    assert bounds.low <= texts.count(tokenizer) <= bounds.high
    ids = parse_request(body({"model": "m", "prompt": [[1, 2], [3, 4, 5]]}), Endpoint.COMPLETIONS)
    assert ids.count(tokenizer) == 3
    assert ids.bounds(tokenizer).exact


@pytest.mark.parametrize(
    ("value", "lane"),
    [(None, None), ("batch", Lane.BATCH), (" Interactive ", Lane.INTERACTIVE)],
)
def test_lane_header(value: str | None, lane: Lane | None) -> None:
    assert parse_lane(value) is lane


def test_an_unknown_lane_header_is_400() -> None:
    with pytest.raises(ApiError, match="must be one of interactive, batch"):
        parse_lane("urgent")


WORDS = " ".join(f"word{i}" for i in range(2000))


@pytest.mark.parametrize(
    ("endpoint", "payload"),
    [
        (
            Endpoint.CHAT,
            {
                **CHAT,
                "tools": [{"type": "function", "function": {"name": "f", "description": WORDS}}],
            },
        ),
        (
            Endpoint.CHAT,
            {
                **CHAT,
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": WORDS}}],
                    }
                ],
            },
        ),
        (Endpoint.CHAT, {**CHAT, "messages": [{"role": "user", "content": "", "name": WORDS}]}),
        (Endpoint.CHAT, {**CHAT, "messages": [{"role": WORDS, "content": ""}]}),
        (Endpoint.COMPLETIONS, {"model": "m", "prompt": "x", "suffix": WORDS}),
    ],
    ids=["tool definitions", "tool call arguments", "a name", "a role", "a suffix"],
)
def test_every_text_the_engine_tokenizes_is_counted(
    endpoint: Endpoint, payload: dict[str, object]
) -> None:
    tokenizer = default_tokenizer()
    parsed = parse_request(body(payload), endpoint)
    words = tokenizer.count(WORDS)
    assert parsed.count(tokenizer) >= words
    bounds = parsed.bounds(tokenizer)
    assert bounds.low <= parsed.count(tokenizer) <= bounds.high
    assert bounds.low >= 2000  # every word is at least one token


def test_a_request_is_charged_every_sequence_and_the_context_it_may_fill() -> None:
    capped = parse_request(
        body({"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 10, "n": 2}),
        Endpoint.COMPLETIONS,
    )
    assert capped.sequences == 3
    assert capped.charge(prompt_tokens=5, context_tokens=4096) == 3 * (5 + 2 * 10)
    # Without max_tokens the engine may generate until the context is full.
    uncapped = parse_request(body(CHAT), Endpoint.CHAT)
    assert uncapped.charge(prompt_tokens=100, context_tokens=4096) == 4096
    # max_tokens past the context cannot be generated, so it is not charged either.
    huge = parse_request(body({**CHAT, "max_tokens": 10**9}), Endpoint.CHAT)
    assert huge.charge(prompt_tokens=100, context_tokens=4096) == 4096


def test_a_body_of_too_many_json_values_is_refused_before_parsing() -> None:
    many = body({"model": "m", "messages": [{"role": "user"}] * 40_000})
    with pytest.raises(ApiError) as error:
        parse_request(many, Endpoint.CHAT)
    assert (error.value.status, error.value.code) == (413, "too_many_json_values")


@given(st.text(alphabet='{}[]",: a\\', max_size=400), st.integers(min_value=1, max_value=60))
def test_the_quick_json_value_count_never_lets_more_values_through(text: str, limit: int) -> None:
    raw = text.encode()
    values = raw.count(b"{") + raw.count(b"[") + raw.count(b'","') + raw.count(b'", "')
    with patch("laneway.gateway.serving.request_body.MAX_JSON_VALUES", limit):
        if values > limit:
            with pytest.raises(ApiError):
                json_values(raw)
        else:
            assert json_values(raw) >= values


@given(st.binary(max_size=400) | st.text(alphabet='{}[]",: a\\é', max_size=400).map(str.encode))
def test_a_body_no_longer_than_the_value_limit_is_within_it(raw: bytes) -> None:
    # Why parse_request skips the scan for such bodies: each counted value takes a byte.
    limit = max(len(raw), 1)
    with patch("laneway.gateway.serving.request_body.MAX_JSON_VALUES", limit):
        assert json_values(raw) <= limit


@given(
    st.lists(st.text(max_size=300), min_size=1, max_size=4),
    st.sampled_from([Endpoint.CHAT, Endpoint.COMPLETIONS]),
    st.booleans(),
)
def test_length_bounds_hold_the_count_and_no_less_than_the_scanned_bounds(
    texts: list[str], endpoint: Endpoint, extra: bool
) -> None:
    if endpoint is Endpoint.CHAT:
        messages = [{"role": "user", "content": text} for text in texts]
        tools = [{"type": "function", "function": {"name": texts[0]}}]
        payload = {"model": "m", "messages": messages, **({"tools": tools} if extra else {})}
    else:
        payload = {"model": "m", "prompt": texts, **({"suffix": texts[-1]} if extra else {})}
    parsed = parse_request(body(payload), endpoint)
    tokenizer = default_tokenizer()
    loose, tight = parsed.length_bounds(tokenizer), parsed.bounds(tokenizer)
    assert loose is not None
    assert loose.low <= parsed.count(tokenizer) <= tight.high <= loose.high
    assert tight.low <= parsed.count(tokenizer)


def test_length_bounds_of_token_prompts_are_exact() -> None:
    parsed = parse_request(body({"model": "m", "prompt": [[1, 2, 3], [4]]}), Endpoint.COMPLETIONS)
    assert parsed.length_bounds(default_tokenizer()) == parsed.bounds(default_tokenizer())
    assert parsed.bounds(default_tokenizer()).exact


@pytest.mark.parametrize(("lists", "refused"), [(62, False), (63, False), (64, True)])
def test_nesting_is_refused_past_the_limit_and_not_at_it(lists: int, refused: bool) -> None:
    # The object and `lists` lists inside it: 1 + lists levels, and as many containers.
    nested = {"model": "m", "prompt": "x", "x": json.loads("[" * lists + "]" * lists)}
    if refused:
        with pytest.raises(ApiError, match="deeper than 64 levels"):
            parse_request(body(nested), Endpoint.COMPLETIONS)
    else:
        assert parse_request(body(nested), Endpoint.COMPLETIONS).prompts == ("x",)
