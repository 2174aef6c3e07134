"""The prefix index (what the gateway routed where) and the prefix-affinity scorer."""

from __future__ import annotations

import pytest

from laneway.routing.prefix_index import (
    PrefixIndex,
    chain_hashes,
    estimated_cached_tokens,
    text_block_hashes,
)
from laneway.routing.scorers import SCORERS, EndpointView
from laneway.routing.scorers.prefix_affinity import PrefixAffinityScorer


def test_text_blocks_are_full_chained_and_capped() -> None:
    assert len(text_block_hashes("x" * 1000, 256, 128)) == 3, "the partial tail is not hashed"
    assert len(text_block_hashes("x" * 10_000, 256, 8)) == 8
    same_block_twice = text_block_hashes("ab" * 256, 256, 10)
    assert same_block_twice[0] != same_block_twice[1], "a block stands for its whole prefix"
    shared = "system prompt " * 40
    first = text_block_hashes(shared + "question one " * 10, 64, 100)
    second = text_block_hashes(shared + "another question " * 10, 64, 100)
    common = len(shared) // 64
    assert first[:common] == second[:common]
    assert first[common] != second[common]


def index_with(capacity: int, **routed: list[int]) -> PrefixIndex:
    index = PrefixIndex(capacity)
    for url, keys in routed.items():
        index.record(url, chain_hashes(keys))
    return index


@pytest.mark.parametrize(
    ("case", "routed", "prompt", "expected"),
    [
        ("nothing routed yet", {}, [1, 2, 3], {}),
        ("a holds the whole prompt", {"a": [1, 2, 3]}, [1, 2, 3], {"a": 3}),
        ("a holds a longer prompt", {"a": [1, 2, 3, 4]}, [1, 2], {"a": 2}),
        ("a holds two of three", {"a": [1, 2, 9]}, [1, 2, 3], {"a": 2}),
        (
            "each endpoint its own depth",
            {"a": [1, 2, 3], "b": [1, 7], "c": [5]},
            [1, 2, 3, 4],
            {"a": 3, "b": 1},
        ),
        ("the same block after another prefix is no match", {"a": [9, 2, 3]}, [1, 2, 3], {}),
    ],
)
def test_matched_blocks_per_endpoint(
    case: str, routed: dict[str, list[int]], prompt: list[int], expected: dict[str, int]
) -> None:
    assert index_with(100, **routed).matched_blocks(chain_hashes(prompt)) == expected, case


def test_each_endpoint_remembers_its_capacity_least_recent_out() -> None:
    index = PrefixIndex(capacity_blocks=4)
    old, new = chain_hashes([1, 2]), chain_hashes([3, 4])
    index.record("a", old)
    index.record("a", new)
    index.record("b", old)
    assert index.blocks == 6
    index.record("a", old)  # touched again: now `new` is the least recent on a
    index.record("a", chain_hashes([5]))
    assert index.matched_blocks(new) == {}
    assert index.matched_blocks(old) == {"a": 2, "b": 2}
    assert index.blocks == 4 + 2


def test_a_forgotten_endpoint_matches_nothing_and_others_keep_theirs() -> None:
    prompt = chain_hashes([1, 2, 3])
    index = index_with(10, a=[1, 2, 3], b=[1, 2, 3])
    index.forget("a")
    assert index.matched_blocks(prompt) == {"b": 3}
    index.record("a", prompt)
    assert index.matched_blocks(prompt) == {"a": 3, "b": 3}


@pytest.mark.parametrize(
    ("matched", "hashed", "prompt_tokens", "expected"),
    [
        (0, 10, 1000, 0),
        (10, 10, 64_000, 64_000),  # a document whose hashed head matches throughout
        (3, 4, 1000, 750),
        (0, 0, 10, 0),  # a prompt shorter than one block: nothing to go on
    ],
)
def test_estimated_cached_tokens(
    matched: int, hashed: int, prompt_tokens: int, expected: int
) -> None:
    assert estimated_cached_tokens(matched, hashed, prompt_tokens) == expected


def view(url: str, backlog: int | None) -> EndpointView:
    return EndpointView(url=url, in_flight=0, prefill_tokens=0, engine=None, backlog_tokens=backlog)


@pytest.mark.parametrize(
    ("case", "endpoints", "expected"),
    [
        (
            "the endpoint holding the prefix: 1,000 queued + 1,000 uncached against 5,000",
            [view("a", 2000), view("b", 5000)],
            [1.0, 0.4],
        ),
        (
            "a hot endpoint loses its affinity: 10,000 queued + 1,000 against an idle 4,000",
            [view("a", 11_000), view("b", 4000)],
            [4000 / 11_000, 1.0],
        ),
        (
            "busy holder against an idle replica recomputing it all: a near tie, for the "
            "other scorers to break (min-max would say 1 against 0)",
            [view("a", 8283), view("b", 8295)],
            [1.0, 1 - 12 / 8295],
        ),
        ("all equal: neutral", [view("a", 5), view("b", 5)], [1.0, 1.0]),
        ("nothing to prefill anywhere: neutral", [view("a", 0), view("b", 0)], [1.0, 1.0]),
        ("no plan made (no backlog): unknown", [view("a", None), view("b", None)], [0.5, 0.5]),
    ],
)
def test_prefix_affinity_scores(
    case: str, endpoints: list[EndpointView], expected: list[float]
) -> None:
    assert PrefixAffinityScorer().score(endpoints) == pytest.approx(expected), case
    assert isinstance(SCORERS["prefixAffinity"], PrefixAffinityScorer)


def _sticky_pick(session: str | None, urls: list[str]) -> str:
    views = [
        EndpointView(url=url, in_flight=0, prefill_tokens=0, engine=None, session_key=session)
        for url in urls
    ]
    scores = SCORERS["sessionHash"].score(views)
    return urls[max(range(len(urls)), key=lambda i: scores[i])]


def test_session_hash_keeps_a_session_on_one_endpoint_and_spreads_sessions() -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    picks = {f"session-{n}": _sticky_pick(f"session-{n}", urls) for n in range(200)}
    assert all(_sticky_pick(s, list(reversed(urls))) == url for s, url in picks.items())
    per_endpoint = [list(picks.values()).count(url) for url in urls]
    assert min(per_endpoint) >= 25, per_endpoint  # about 50 each
    # An endpoint leaving moves its own sessions only (rendezvous hashing).
    survivors = urls[1:]
    moved = [s for s, url in picks.items() if url != urls[0] and _sticky_pick(s, survivors) != url]
    assert moved == []
    no_session = [EndpointView(url=url, in_flight=0, prefill_tokens=0, engine=None) for url in urls]
    assert SCORERS["sessionHash"].score(no_session) == [0.5] * 4
