"""The served model name turns back into the public one, in whole bodies and split streams."""

from __future__ import annotations

import json

import pytest

from laneway.gateway.serving.model_name import ModelNameRewriter, rewriter

SERVED, PUBLIC = "llama-small", "llama"


def compact(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # vLLM, SGLang and the sim's streams: compact JSON
        (
            b'{"id":"a","model":"llama-small","choices":[]}',
            b'{"id":"a","model":"llama","choices":[]}',
        ),
        # json.dumps defaults (the sim's non-streaming answers)
        (b'{"id": "a", "model": "llama-small"}', b'{"id": "a", "model": "llama"}'),
        # first key, and whitespace before the key
        (b'{ "model" : "llama-small"}', b'{ "model" : "llama"}'),
        # another model's name that starts with the served one is left alone
        (b'{"model":"llama-small-v2"}', b'{"model":"llama-small-v2"}'),
        # the field's text inside generated content is escaped, so it is no key: untouched
        (
            compact({"text": 'say {"model":"llama-small"} and ,"model":"llama-small"'}),
            compact({"text": 'say {"model":"llama-small"} and ,"model":"llama-small"'}),
        ),
        # a key that merely ends in model
        (b'{"my_model":"llama-small"}', b'{"my_model":"llama-small"}'),
        # no served name at all: the same bytes
        (b'{"error":{"message":"bad"}}', b'{"error":{"message":"bad"}}'),
    ],
)
def test_whole_bodies(body: bytes, expected: bytes) -> None:
    assert ModelNameRewriter(SERVED, PUBLIC).whole(body) == expected
    if body != expected:
        assert json.loads(ModelNameRewriter(SERVED, PUBLIC).whole(body))  # still valid JSON


@pytest.mark.parametrize(
    ("served", "public"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama"),  # a slash needs no escaping in JSON
        ("modèle", "model"),  # non-ASCII: pydantic writes UTF-8, json.dumps writes \u00e8
        ('odd"name\\', "plain"),  # quotes and backslashes escaped in the pattern
    ],
)
def test_names_as_every_serialiser_writes_them(served: str, public: str) -> None:
    for ensure_ascii in (True, False):
        body = json.dumps({"model": served, "n": 1}, ensure_ascii=ensure_ascii).encode()
        assert json.loads(ModelNameRewriter(served, public).whole(body)) == {
            "model": public,
            "n": 1,
        }


def sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + compact(p) + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


def test_a_stream_split_at_every_byte_comes_out_whole_and_rewritten() -> None:
    stream = sse(
        {"id": "c", "model": SERVED, "choices": [{"delta": {"role": "assistant"}}]},
        {"id": "c", "model": SERVED, "choices": [{"delta": {"content": '"model":"x"'}}]},
        {"id": "c", "model": SERVED, "choices": [], "usage": {"prompt_tokens": 3}},
    )
    expected = stream.replace(b'"model":"llama-small"', b'"model":"llama"')
    assert expected.count(b'"model":"llama"') == 3
    for cut in range(len(stream) + 1):
        rename = ModelNameRewriter(SERVED, PUBLIC)
        out = rename.feed(stream[:cut]) + rename.feed(stream[cut:]) + rename.flush()
        assert out == expected, f"split at byte {cut}"


def test_a_stream_byte_by_byte_holds_back_only_the_partial_line() -> None:
    rename = ModelNameRewriter(SERVED, PUBLIC)
    event = b'data: {"model":"llama-small"}\n\n'
    fed = [rename.feed(event[i : i + 1]) for i in range(len(event))]
    # Nothing reaches the client before the line is complete, then all of it at once.
    assert fed[: event.index(b"\n")] == [b""] * event.index(b"\n")
    assert b"".join(fed) == b'data: {"model":"llama"}\n\n'
    assert rename.flush() == b""


def test_a_stream_cut_off_mid_line_flushes_what_it_held() -> None:
    rename = ModelNameRewriter(SERVED, PUBLIC)
    assert rename.feed(b'data: {"id":"c","model":"llama-small"') == b""
    assert rename.flush() == b'data: {"id":"c","model":"llama"'


def test_asking_for_the_served_name_rewrites_nothing() -> None:
    assert rewriter(SERVED, SERVED) is None
    assert rewriter(SERVED, PUBLIC) is not None
