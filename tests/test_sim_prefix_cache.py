"""The simulator's prefix cache: hand-worked block hashes, hits, eviction; then in the engine."""

from __future__ import annotations

import dataclasses

import pytest
from support.profiles import small_kv_profile

from laneway.simulator.engine import BlocksCached, BlocksEvicted, EngineCore
from laneway.simulator.prefix_cache import PrefixCache, PrefixHit, block_hashes
from laneway.simulator.profiles import PROFILES
from laneway.simulator.scheduler import KV_BLOCK_TOKENS, SchedulerConfig

B = 4  # a small block size keeps the hand-worked cases readable


def test_only_full_blocks_are_hashed_and_each_hash_carries_its_prefix() -> None:
    assert len(block_hashes(range(8), B)) == 2
    assert len(block_hashes(range(7), B)) == 1, "a partial last block has no hash"
    assert block_hashes(range(3), B) == ()
    first, second = block_hashes([1, 2, 3, 4, 1, 2, 3, 4], B)
    assert first != second, "the same tokens after a different prefix are a different block"
    whole = block_hashes(list(range(12)), B)
    assert block_hashes(list(range(4, 12)), B, parent=whole[0]) == whole[1:]


def cache_holding(*prompts: list[int]) -> PrefixCache:
    """A cache after each prompt ran alone and finished (its blocks free, still cached)."""
    cache = PrefixCache(B)
    for prompt in prompts:
        hashes = block_hashes(prompt, B)
        cache.acquire(hashes, len(prompt), PrefixHit(blocks=0, evictable=0))
        for block_hash in hashes:
            cache.hold(block_hash)
        cache.release(hashes)
    return cache


A = list(range(100, 112))  # three blocks


@pytest.mark.parametrize(
    ("case", "prompt", "expected_blocks"),
    [
        ("A plus one more block hits all of A", [*A, 1, 2, 3, 4], 3),
        ("A plus a partial block hits all of A", [*A, 1], 3),
        ("A itself: its last token is recomputed, so its last block is", A, 2),
        ("A's first block and one token more: the one block", A[:5], 1),
        ("A's first block exactly: the hit would leave nothing to compute", A[:4], 0),
        ("differs in the second block: only the first hits", [*A[:4], 0, *A[5:]], 1),
        ("differs in the first token: nothing hits", [0, *A[1:]], 0),
    ],
)
def test_lookup_finds_the_longest_cached_prefix(
    case: str, prompt: list[int], expected_blocks: int
) -> None:
    hit = cache_holding(A).lookup(block_hashes(prompt, B), len(prompt))
    assert hit == PrefixHit(blocks=expected_blocks, evictable=expected_blocks), case


def test_hits_and_queries_count_tokens_as_vllm_does() -> None:
    cache = cache_holding(A)
    assert (cache.query_tokens, cache.hit_tokens) == (12, 0)
    prompt = [*A, 7, 7]
    hashes = block_hashes(prompt, B)
    cache.acquire(hashes, len(prompt), cache.lookup(hashes, len(prompt)))
    assert (cache.query_tokens, cache.hit_tokens) == (12 + 14, 3 * B)


def test_blocks_in_use_are_not_evictable_and_free_ones_go_least_recent_first() -> None:
    other = list(range(500, 508))  # two blocks
    cache = cache_holding(A, other)
    # Freed tail first: A's last block is the oldest free block, `other`'s first the newest.
    assert cache.evict(1) == (block_hashes(A, B)[-1],)
    assert cache.lookup(block_hashes([*A, 0], B), 13) == PrefixHit(blocks=2, evictable=2)
    assert len(cache.evict(2)) == 2
    assert cache.lookup(block_hashes([*A, 0], B), 13) == PrefixHit(blocks=0, evictable=0)
    assert cache.lookup(block_hashes([*other, 0], B), 9) == PrefixHit(blocks=2, evictable=2)

    # A running request holds `other`'s blocks: eviction cannot touch them.
    hashes = block_hashes([*other, 0], B)
    cache.acquire(hashes, 9, PrefixHit(blocks=2, evictable=2))
    assert cache.evict(5) == ()
    assert cache.lookup(hashes, 9) == PrefixHit(blocks=2, evictable=0), (
        "held blocks are hits, not evictable"
    )
    assert cache.release(hashes[:2]) == 2
    assert cache.free_cached_blocks == 2


def test_two_requests_filling_the_same_block_share_it() -> None:
    cache = PrefixCache(B)
    (block,) = block_hashes(A[:4], B)
    assert cache.hold(block) is True
    assert cache.hold(block) is False, "the second holder adds no block in use"
    assert cache.release([block]) == 0
    assert cache.release([block]) == 1
    assert cache.in_use_blocks == 0


# -- in the engine ------------------------------------------------------------------------

H200 = PROFILES["h200-llama3-8b"]
CHUNKED = SchedulerConfig(
    kind="chunked",
    token_budget=2048,
    chunk_size=1024,
    max_num_seqs=16,
    max_partial_prefills=4,
    max_context=32768,
)


def run_alone(core: EngineCore, rid: str, tokens: list[int], output: int = 4) -> list[int]:
    """Submit one request and step until it finishes; the prefill tokens of each step."""
    core.submit(rid, len(tokens), output, block_hashes(tokens, KV_BLOCK_TOKENS))
    prefills = []
    while core.has_work:
        outcome = core.step()
        assert outcome is not None
        prefills.append(sum(chunk.tokens for chunk in outcome.work.prefill))
    return prefills


def test_a_second_turn_prefills_only_what_the_cache_lacks() -> None:
    core = EngineCore(H200, CHUNKED)
    history = list(range(3000))
    assert sum(run_alone(core, "turn1", history)) == 3000
    # 187 full blocks of the first turn are cached; the second turn recomputes the rest.
    second = [*history, *range(9000, 9100)]
    assert sum(run_alone(core, "turn2", second)) == 3100 - 187 * 16
    assert core.prefix_cache.hit_tokens == 187 * 16
    assert core.prefix_cache.query_tokens == 3000 + 3100
    assert core.kv_used_blocks == 0, "finished requests hold no blocks; their cache is free"
    assert core.prefix_cache.free_cached_blocks == 3100 // 16


def test_an_aborted_prefill_leaves_its_computed_blocks_cached_for_its_resend() -> None:
    """Closing a request mid-prefill frees its slot and KV; the full blocks it computed stay
    in the prefix cache (free, evictable), so the same prompt sent again prefills only the
    rest: what a reclaimed batch replica's re-queued document relies on."""
    core = EngineCore(H200, CHUNKED)
    document = list(range(4000))
    core.submit("doc", len(document), 4, block_hashes(document, KV_BLOCK_TOKENS))
    for _ in range(2):  # one 1,024-token chunk per step: the chunk caps a lone prompt
        assert core.step() is not None
    core.abort("doc")
    assert not core.has_work
    assert core.kv_used_blocks == 0
    assert core.prefix_cache.free_cached_blocks == 2048 // KV_BLOCK_TOKENS
    assert sum(run_alone(core, "doc-again", document)) == 4000 - 2048


def test_the_first_chunk_after_a_hit_attends_to_the_cached_context() -> None:
    core = EngineCore(H200, CHUNKED)
    document = list(range(4096))
    run_alone(core, "q1", [*document, 1])
    core.submit("q2", 4096 + 50, 4, block_hashes([*document, *range(50)], KV_BLOCK_TOKENS))
    outcome = core.step()
    assert outcome is not None
    (chunk,) = outcome.work.prefill
    assert (chunk.context_before, chunk.tokens) == (4096, 50)


def test_prefix_caching_off_computes_every_prompt_whole() -> None:
    core = EngineCore(H200, dataclasses.replace(CHUNKED, prefix_caching=False))
    tokens = list(range(2000))
    run_alone(core, "a", tokens)
    assert sum(run_alone(core, "b", tokens)) == 2000
    assert core.prefix_cache.query_tokens == 0


def test_kv_pressure_evicts_free_cached_blocks_and_never_blocks_admission() -> None:
    # Room for 1,000 blocks: three 8k-token documents cannot all stay cached.
    core = EngineCore(small_kv_profile(16_000), CHUNKED)
    documents = [list(range(start, start + 8000)) for start in (0, 10**6, 2 * 10**6)]
    for index, document in enumerate(documents):
        run_alone(core, f"d{index}", document)
        assert core.kv_used_blocks == 0
        cache = core.prefix_cache
        assert cache.free_cached_blocks <= core.kv_capacity_blocks
    # The newest document is still cached; the oldest was evicted to make room.
    assert sum(run_alone(core, "again2", [*documents[2], 5])) < 100
    assert sum(run_alone(core, "again0", [*documents[0], 5])) > 4000


def test_the_engine_journals_what_enters_and_leaves_its_cache_as_vllm_publishes_it() -> None:
    core = EngineCore(small_kv_profile(16_000), CHUNKED, record_cache_events=True)
    assert core.cache_events == []
    history = list(range(3000))
    run_alone(core, "turn1", history)
    hashes = block_hashes(history, KV_BLOCK_TOKENS)
    cached = [e for e in core.cache_events if isinstance(e, BlocksCached)]
    # Filled chunk by chunk, each run chained to the block before it.
    assert [h for e in cached for h in e.hashes] == list(hashes)
    assert cached[0].parent is None
    assert cached[0].first == 0
    assert all(e.parent == hashes[e.first - 1] for e in cached[1:])
    core.cache_events.clear()
    second = [*history, *range(9000, 9100)]
    run_alone(core, "turn2", second)
    (new,) = core.cache_events
    assert isinstance(new, BlocksCached)
    # Only the blocks the first turn had not cached, chained from its last full block.
    assert (new.request_id, new.first, new.parent) == ("turn2", 187, hashes[186])
    assert new.hashes == block_hashes(second, KV_BLOCK_TOKENS)[187:]
    core.cache_events.clear()
    run_alone(core, "big", list(range(10**6, 10**6 + 14_000)))
    evicted = [h for e in core.cache_events if isinstance(e, BlocksEvicted) for h in e.hashes]
    assert evicted, "room for 1,000 blocks: the chat's blocks had to go"
    assert set(evicted) <= set(block_hashes(second, KV_BLOCK_TOKENS))


def test_without_a_publisher_nothing_is_journaled() -> None:
    core = EngineCore(H200, CHUNKED)
    run_alone(core, "a", list(range(100)))
    assert core.cache_events is None
