"""Batch input lines and create requests: every bad line named, every good one kept."""

from __future__ import annotations

import asyncio
import json

import pytest

from laneway.gateway.batch.batches import pieces
from laneway.gateway.batch.creation import SLICE_LINES, Turn, validate
from laneway.gateway.batch.lines import (
    Entry,
    LineError,
    parse_create,
    parse_input,
    slices,
)
from laneway.gateway.errors import ApiError

CHAT = "/v1/chat/completions"


def line(**fields: object) -> str:
    base: dict[str, object] = {
        "custom_id": "a",
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": []},
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None})


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        ("{oops", "invalid_json", "line 1: not valid JSON"),
        ("[1, 2]", "invalid_request", "line 1: must be a JSON object"),
        (line(custom_id=None), "missing_custom_id", "'custom_id' must be a non-empty string"),
        (line(custom_id=""), "missing_custom_id", "'custom_id' must be a non-empty string"),
        (line(method="GET"), "invalid_method", "'method' must be 'POST', got 'GET'"),
        (line(url="/v1/completions"), "mismatched_url", "must be the batch's endpoint"),
        (line(body=[1]), "invalid_body", "'body' must be a JSON object"),
        (line(body={"stream": True}), "invalid_body", "'stream' is not supported"),
    ],
)
def test_each_bad_line_is_reported_with_its_number(raw: str, code: str, message: str) -> None:
    items, errors = parse_input(raw.encode(), CHAT)
    assert items == []
    assert len(errors) == 1
    assert errors[0].code == code
    assert message in errors[0].message


def test_good_lines_are_kept_blank_lines_skipped_and_duplicates_refused() -> None:
    content = "\n".join(
        [line(custom_id="a"), "", "   ", line(custom_id="b"), line(custom_id="a"), "{"]
    )
    items, errors = parse_input(content.encode(), CHAT)
    assert [(i.index, i.custom_id) for i in items] == [(0, "a"), (3, "b")]
    body = json.dumps({"model": "m", "messages": []}).encode()
    assert items[0] == Entry(index=0, custom_id="a", body=body)
    assert [(e.index, e.custom_id, e.code) for e in errors] == [
        (4, "a", "duplicate_custom_id"),
        (5, None, "invalid_json"),
    ]
    assert isinstance(errors[0], LineError)
    assert errors[0].message.startswith("line 5: ")


GOOD = {"input_file_id": "file-1", "endpoint": CHAT, "completion_window": "24h"}


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ([], None),
        ({**GOOD, "input_file_id": 3}, "input_file_id"),
        ({**GOOD, "endpoint": "/v1/embeddings"}, "endpoint"),
        ({**GOOD, "completion_window": "1h"}, "completion_window"),
        ({**GOOD, "metadata": {"k": 1}}, "metadata"),
        ({**GOOD, "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ],
)
def test_bad_create_requests_name_the_field(payload: object, param: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        parse_create(payload)
    assert caught.value.status == 400
    assert caught.value.param == param


def test_a_good_create_request() -> None:
    request = parse_create({**GOOD, "metadata": {"team": "legal"}})
    assert (request.input_file_id, request.endpoint) == ("file-1", CHAT)
    assert request.metadata == {"team": "legal"}


def test_slices_hold_at_most_their_lines_and_bytes_and_cover_the_file() -> None:
    content = b"\n".join([b"a" * 10] * 7 + [b"b" * 100] + [b"", b"c"])
    cut = list(slices(content, max_lines=3, max_bytes=25))
    assert [(first, len(lines)) for first, lines in cut] == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert [line for _, lines in cut for line in lines] == content.split(b"\n")
    # The line that takes a slice past max_bytes ends it, whole.
    assert cut[2][1] == [b"a" * 10, b"b" * 100]


def request_line(index: int) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": f"item {index}"}]}
    line = {"custom_id": f"r{index}", "method": "POST", "url": CHAT, "body": body}
    return json.dumps(line).encode()


class FakeClock:
    """Time that moves only when told to, `step` seconds at each look."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


async def count_turns(turns: list[int]) -> None:
    while True:  # counts each time the loop lets it run
        turns[0] += 1
        await asyncio.sleep(0)


async def test_a_turn_yields_the_loop_only_once_its_time_is_spent() -> None:
    clock = FakeClock()
    turn = Turn(budget_s=0.005, clock=clock)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    task = asyncio.create_task(other())
    clock.now = 0.004
    await turn.pause()
    assert ran == []  # within its time: no other task ran meanwhile
    clock.now = 0.005
    await turn.pause()
    assert ran == ["other"]
    await task


async def test_validating_yields_whenever_its_time_is_spent_not_after_a_count_of_lines() -> None:
    # Every look at the clock finds 10 ms gone (slow lines on a slow machine): validation
    # lets the loop run after every slice, not only every few hundred lines.
    content = b"\n".join(request_line(i) for i in range(SLICE_LINES * 8))
    turns = [0]
    counting = asyncio.create_task(count_turns(turns))
    validated = await validate(content, CHAT, turn=Turn(budget_s=0.005, clock=FakeClock(0.01)))
    counting.cancel()
    assert len(validated.entries) == SLICE_LINES * 8
    assert validated.tokens == sum(entry.cost for entry in validated.entries)
    assert turns == [8]


async def test_validating_within_its_time_does_not_yield_at_all() -> None:
    content = b"\n".join(request_line(i) for i in range(SLICE_LINES * 8))
    turns = [0]
    counting = asyncio.create_task(count_turns(turns))
    await validate(content, CHAT, turn=Turn(budget_s=0.005, clock=FakeClock()))
    counting.cancel()
    assert turns == [0]


def test_pieces_hold_at_most_their_items_and_bytes_and_cover_every_item() -> None:
    sizes = [10] * 7 + [100, 1, 1]
    cut = list(pieces(sizes, max_items=3, max_bytes=25))
    # The item that takes a piece past max_bytes ends it.
    assert cut == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert list(pieces([], max_items=3, max_bytes=25)) == []
    assert list(pieces([5, 5], max_items=3, max_bytes=25)) == [range(0, 2)]
