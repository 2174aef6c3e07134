"""The prefix index (what the gateway routed where) and the prefix-affinity scorer."""

from __future__ import annotations

import pytest
from support.given_facts import GivenFacts, cycle_over
from support.ledger import pool, route_to

from laneway.routing.cycle import BACKLOG_TOKENS, CycleState, EndpointLoad
from laneway.routing.prefix_index import (
    PrefixIndex,
    chain_hashes,
    estimated_cached_tokens,
    leading_block_hashes,
)
from laneway.routing.scorers import SCORERS
from laneway.routing.scorers.prefix_affinity import PrefixAffinityScorer


def test_text_blocks_are_full_chained_and_capped() -> None:
    assert len(leading_block_hashes("x" * 1000, 256, 128)) == 3, "the partial tail is not hashed"
    assert len(leading_block_hashes("x" * 10_000, 256, 8)) == 8
    same_block_twice = leading_block_hashes("ab" * 256, 256, 10)
    assert same_block_twice[0] != same_block_twice[1], "a block stands for its whole prefix"
    shared = "system prompt " * 40
    first = leading_block_hashes(shared + "question one " * 10, 64, 100)
    second = leading_block_hashes(shared + "another question " * 10, 64, 100)
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


def affinity_cycle(prompt_tokens: int, endpoints: dict[str, tuple[int, int]]) -> CycleState:
    """A prompt of `prompt_tokens` on endpoints given as url: (prefill tokens queued there,
    prompt tokens its cache is estimated to hold)."""
    facts = GivenFacts(
        loads={url: EndpointLoad(prefill_tokens=queued) for url, (queued, _) in endpoints.items()},
        cached={url: cached for url, (_, cached) in endpoints.items()},
    )
    documents = pool(limits={"maxContextTokens": 32768})
    return cycle_over(route_to(documents, prompt_tokens), list(endpoints), facts)


@pytest.mark.parametrize(
    ("case", "prompt_tokens", "endpoints", "backlogs", "expected"),
    [
        (
            "the endpoint holding the prefix: 1,000 queued + 1,000 uncached against 5,000",
            5000,
            {"a": (1000, 4000), "b": (0, 0)},
            [2000, 5000],
            [1.0, 0.4],
        ),
        (
            "a hot endpoint loses its affinity: 10,000 queued + 1,000 against an idle 4,000",
            4000,
            {"a": (10_000, 3000), "b": (0, 0)},
            [11_000, 4000],
            [4000 / 11_000, 1.0],
        ),
        (
            "busy holder against an idle replica recomputing it all: a near tie, for the "
            "other scorers to break (min-max would say 1 against 0)",
            8295,
            {"a": (7988, 8000), "b": (0, 0)},
            [8283, 8295],
            [1.0, 1 - 12 / 8295],
        ),
        ("all equal: neutral", 5, {"a": (0, 0), "b": (0, 0)}, [5, 5], [1.0, 1.0]),
        (
            "nothing to prefill anywhere: neutral",
            1000,
            {"a": (0, 1000), "b": (0, 1000)},
            [0, 0],
            [1.0, 1.0],
        ),
    ],
)
def test_prefix_affinity_scores(
    case: str,
    prompt_tokens: int,
    endpoints: dict[str, tuple[int, int]],
    backlogs: list[int],
    expected: list[float],
) -> None:
    cycle = affinity_cycle(prompt_tokens, endpoints)
    assert list(cycle[BACKLOG_TOKENS]) == backlogs, case
    assert PrefixAffinityScorer().scores(cycle) == pytest.approx(expected), case
    assert isinstance(SCORERS["prefixAffinity"], PrefixAffinityScorer)


def _session_scores(session: str | None, urls: list[str]) -> list[float]:
    cycle = cycle_over(route_to(pool()), urls, GivenFacts(), session_key=session)
    return SCORERS["sessionHash"].scores(cycle)


def _sticky_pick(session: str | None, urls: list[str]) -> str:
    scores = _session_scores(session, urls)
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
    assert _session_scores(None, urls) == [0.5] * 4
