"""vLLM's KV cache events, decoded from the wire and applied to the gateway's exact index."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from laneway.routing.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockFeed,
    KVEventError,
    cached_tokens,
    parse_event_batch,
    token_block_keys,
)
from laneway.routing.prefix_index import PrefixIndex

URL = "http://engine-0:8000"
PROMPT = list(range(100, 148))  # three blocks of 16 tokens


def wire(events: list[Any]) -> Any:
    """A KVEventBatch as vLLM's msgspec encoder writes it, read back by msgpack."""
    return msgpack.unpackb(msgpack.packb([1733000000.5, events, 0]))


def stored_array(hashes: list[Any], parent: Any, tokens: list[int]) -> list[Any]:
    # vLLM 0.9-0.11: tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium
    return ["BlockStored", hashes, parent, tokens, 16, None, "GPU"]


def stored_map(hashes: list[Any], parent: Any, tokens: list[int]) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU",
            "lora_name": None}  # fmt: skip


@pytest.mark.parametrize("stored", [stored_array, stored_map], ids=["array", "map"])
def test_stored_blocks_in_two_events_chain_into_what_the_prompt_matches(stored: Any) -> None:
    index = PrefixIndex(capacity_blocks=100)
    feed = EngineBlockFeed(URL, index)
    # The engine's hashes are opaque to the gateway (sha256 bytes in newer vLLM).
    feed.apply(parse_event_batch(wire([stored([b"h1", b"h2"], None, PROMPT[:32])])))
    feed.apply(parse_event_batch(wire([stored([b"h3"], b"h2", PROMPT[32:48])])))
    keys = token_block_keys([*PROMPT, 7, 8], 16)
    assert len(keys) == 3
    assert index.matched_blocks(keys) == {URL: 3}
    other = token_block_keys(PROMPT[:16] + [0] * 32, 16)  # shares the first block only
    assert index.matched_blocks(other) == {URL: 1}


def test_removed_blocks_and_a_cleared_cache_leave_the_index() -> None:
    index = PrefixIndex(capacity_blocks=100)
    feed = EngineBlockFeed(URL, index)
    feed.apply(parse_event_batch(wire([stored_array([1, 2, 3], None, PROMPT)])))
    keys = token_block_keys(PROMPT, 16)
    feed.apply(parse_event_batch(wire([["BlockRemoved", [3], "GPU"]])))
    assert index.matched_blocks(keys) == {URL: 2}
    feed.apply(parse_event_batch(wire([{"type": "AllBlocksCleared"}])))
    assert index.matched_blocks(keys) == {}
    assert index.blocks_of(URL) == 0


def test_a_block_whose_parent_was_never_seen_is_left_out() -> None:
    index = PrefixIndex(capacity_blocks=100)
    feed = EngineBlockFeed(URL, index)
    # Subscribed late: the parent's BlockStored went by before.
    feed.apply(parse_event_batch(wire([stored_array([9], 8, PROMPT[16:32])])))
    assert index.blocks_of(URL) == 0


@pytest.mark.parametrize(
    ("case", "batch", "expected"),
    [
        ("an unknown event kind is skipped", [0.0, [["BlockMoved", [1]]]], []),
        ("cleared, array layout", [0.0, [["AllBlocksCleared"]]], [AllBlocksCleared()]),
        (
            "removed, map layout",
            [0.0, [{"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}]],
            [BlockRemoved((5,))],
        ),
        (
            "stored, array layout, newer trailing fields ignored",
            [0.0, [[*stored_array([1], None, PROMPT[:16]), "lora", None]]],
            [BlockStored((1,), None, tuple(PROMPT[:16]), 16)],
        ),
    ],
)
def test_parse_event_batch(case: str, batch: Any, expected: list[Any]) -> None:
    assert parse_event_batch(batch) == expected, case


@pytest.mark.parametrize(
    "batch",
    [
        "not a batch",
        [0.0],
        [0.0, "events"],
        [0.0, [42]],
        [0.0, [["BlockStored", [1], None]]],  # too few fields
        [
            0.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [1],
                    "parent_block_hash": None,
                    "token_ids": [1],
                    "block_size": "sixteen",
                }
            ],
        ],
    ],
)
def test_a_malformed_batch_is_a_clear_error(batch: Any) -> None:
    with pytest.raises(KVEventError):
        parse_event_batch(batch)


@pytest.mark.parametrize(
    ("matched", "prompt_tokens", "expected"),
    [(3, 100, 48), (3, 48, 47), (0, 10, 0), (0, 0, 0)],
)
def test_cached_tokens_never_include_the_last_prompt_token(
    matched: int, prompt_tokens: int, expected: int
) -> None:
    assert cached_tokens(matched, 16, prompt_tokens) == expected
