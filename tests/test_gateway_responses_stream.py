"""A Responses stream as the gateway reads it, on the bytes `laneway sim` writes (vLLM's
framing): which chunk completes the first token, how many content events a chunk holds
(TBT), and the response its terminal event carries, however the transport splits it."""

from __future__ import annotations

import pytest

from laneway.gateway.serving.first_token import FirstTokenWatch, carries_output, content_events_of
from laneway.gateway.serving.request_body import Endpoint
from laneway.gateway.serving.responses import MadeResponse, TerminalEventWatch, made_by_answer
from laneway.simulator.openai_framing import GenerationRequest
from laneway.simulator.responses import ResponseReply, ResponsesRequest, sse_event

TOKENS = 3


def sim_stream(store: bool = True) -> tuple[bytes, ResponseReply]:
    generation = GenerationRequest(
        endpoint="responses", prompt_tokens=20, max_tokens=TOKENS, stream=True,
        include_usage=True,
    )  # fmt: skip
    request = ResponsesRequest(
        generation=generation, body={"input": "hi"}, messages=[], store=store, previous=None
    )
    reply = ResponseReply(request=request, model="llama-small", created=0)
    events = [*reply.opening(), *(reply.delta(i) for i in range(TOKENS)), *reply.closing(TOKENS)]
    return b"".join(sse_event(event, n) for n, event in enumerate(events)), reply


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)]


def test_only_a_delta_with_text_carries_output() -> None:
    stream, _ = sim_stream()
    data_lines = [line for line in stream.split(b"\n") if line.startswith(b"data:")]
    carrying = [carries_output(line) for line in data_lines]
    # created, in_progress, output_item.added, content_part.added; 3 deltas; 4 closing
    assert carrying == [False] * 4 + [True] * TOKENS + [False] * 4
    empty = b'data: {"type":"response.output_text.delta","delta":""}'
    assert not carries_output(empty)


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_the_first_token_is_the_chunk_completing_the_first_delta(size: int) -> None:
    stream, _ = sim_stream()
    event = b"event: response.output_text.delta\ndata:"
    first_delta_ends = stream.index(b"\n", stream.index(event) + len(event)) + 1
    watch = FirstTokenWatch()
    read = 0
    for chunk in chunks(stream, size):
        read += len(chunk)
        if watch.feed(chunk):
            break
    assert watch.seen
    assert read - len(chunk) < first_delta_ends <= read


def test_tbt_counts_a_responses_deltas_and_a_chats_data_events() -> None:
    stream, _ = sim_stream()
    assert content_events_of(Endpoint.RESPONSES)(stream) == TOKENS
    chat = b'data: {"choices":[]}\n\ndata: {"choices":[]}\n\ndata: [DONE]\n\n'
    assert content_events_of(Endpoint.CHAT)(chat) == 2


@pytest.mark.parametrize("size", [1, 5, 64, 100_000])
@pytest.mark.parametrize("store", [True, False])
def test_the_terminal_event_gives_the_response_however_split(size: int, store: bool) -> None:
    stream, reply = sim_stream(store)
    watch = TerminalEventWatch()
    pieces = chunks(stream, size)
    completing = [watch.feed(chunk) for chunk in pieces]
    # The stream's last chunk completes its terminal event (the relay's end marker).
    assert completing == [False] * (len(pieces) - 1) + [True]
    assert watch.made == MadeResponse(
        response_id=reply.response_id, stored=store, input_tokens=20, output_tokens=TOKENS
    )
    assert watch.made.context_tokens == 20 + TOKENS


@pytest.mark.parametrize(
    ("answer", "asked", "kept"),
    [
        # vLLM 0.32's response object has no `store`: the request's says what was asked.
        (b'{"id": "resp_1"}', True, True),
        (b'{"id": "resp_1"}', False, False),
        # An answer that says (laneway sim, OpenAI) is taken at its word.
        (b'{"id": "resp_1", "store": false}', True, False),
        (b'{"id": "resp_1", "store": true}', True, True),
    ],
)
def test_an_answer_without_store_is_kept_as_the_request_asked(
    answer: bytes, asked: bool, kept: bool
) -> None:
    made = made_by_answer(answer)
    assert made is not None
    assert made.kept(asked=asked) is kept
