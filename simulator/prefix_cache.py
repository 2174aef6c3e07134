"""Automatic prefix caching, as vLLM V1 does it, over block hashes: pure, no clock, no I/O.

What the engines really do, and this module copies (vLLM `vllm/v1/core/kv_cache_utils.py`,
`kv_cache_manager.py`, `block_pool.py`, `single_type_kv_cache_manager.py`):

- The prompt is cut into blocks of `block_size` tokens (16 by default on GPUs); only *full*
  blocks are hashed and cached. Each block's hash covers its parent's hash and its own
  tokens, so a block matches only if everything before it matches too (`block_hashes`).
- A lookup walks the request's block hashes from the start and stops at the first miss
  (`find_longest_cache_hit`). The hit is capped at `num_tokens - 1` tokens: even a fully
  cached prompt recomputes its last token to get logits, and since hits are whole blocks,
  a prompt of exactly k blocks can hit at most k - 1 of them (`get_computed_blocks`).
- Statistics: every lookup counts the request's prompt tokens as *queries* and the matched
  tokens as *hits*; `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` export them
  (tokens, not requests). SGLang exports the ratio as the gauge `sglang:cache_hit_rate`.
- Blocks in use by a running request are never evicted. A finished request's blocks stay
  cached but free; allocation takes free blocks LRU-first and drops the evicted block's
  hash. A finished request's blocks are freed tail first, so its last blocks go before its
  first ones, which other prompts are likelier to share (`KVCacheManager.free`).

The engine owns the count of physical blocks; this class keeps which cached hashes are in
use (by how many requests) and which are free in LRU order, and says what a hit costs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on CUDA
ROOT_HASH = 0  # the parent of a prompt's first block


def block_hashes(
    token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, parent: int = ROOT_HASH
) -> tuple[int, ...]:
    """The chained hash of every full block of `token_ids`; a partial last block has none.

    `parent` continues a chain: the hashes of `a + b` are those of `a` followed by those of
    `b` chained from `a`'s last hash, when `a` is a whole number of blocks.
    """
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start : start + block_size]))
        hashes.append(parent)
    return tuple(hashes)


@dataclass(frozen=True)
class PrefixHit:
    blocks: int  # leading blocks of the prompt found in the cache
    evictable: int  # of those, the ones now free (taking them uses up free blocks)


NO_HIT = PrefixHit(blocks=0, evictable=0)


class PrefixCache:
    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = block_size
        self._in_use: dict[int, int] = {}  # block hash -> running requests that hold it
        self._free: OrderedDict[int, None] = OrderedDict()  # cached, unused; oldest first
        self.query_tokens = 0  # what vllm:prefix_cache_queries counts
        self.hit_tokens = 0  # what vllm:prefix_cache_hits counts

    @property
    def in_use_blocks(self) -> int:
        return len(self._in_use)

    @property
    def free_cached_blocks(self) -> int:
        return len(self._free)

    def lookup(self, hashes: Sequence[int], prompt_tokens: int) -> PrefixHit:
        """The longest cached prefix of a prompt, without changing anything."""
        most = (prompt_tokens - 1) // self.block_size
        evictable = 0
        blocks = 0
        for block_hash in hashes[:most]:
            if block_hash in self._free:
                evictable += 1
            elif block_hash not in self._in_use:
                break
            blocks += 1
        return PrefixHit(blocks=blocks, evictable=evictable)

    def acquire(self, hashes: Sequence[int], prompt_tokens: int, hit: PrefixHit) -> None:
        """A request starts with `hit` (from `lookup`, unchanged since): hold its blocks."""
        self.query_tokens += prompt_tokens
        self.hit_tokens += hit.blocks * self.block_size
        for block_hash in hashes[: hit.blocks]:
            self._free.pop(block_hash, None)
            self._in_use[block_hash] = self._in_use.get(block_hash, 0) + 1

    def hold(self, block_hash: int) -> bool:
        """A running request filled a block: cache it, or share the copy cached already
        (another request computed the same block). True if the block was not in use."""
        holders = self._in_use.get(block_hash, 0)
        if not holders:
            self._free.pop(block_hash, None)
        self._in_use[block_hash] = holders + 1
        return not holders

    def release(self, hashes: Sequence[int]) -> int:
        """A request that held these cached blocks (in prompt order) finished or left;
        how many of them no request holds any more (they become free, still cached)."""
        freed = 0
        for block_hash in reversed(hashes):
            holders = self._in_use[block_hash] - 1
            if holders:
                self._in_use[block_hash] = holders
            else:
                del self._in_use[block_hash]
                self._free[block_hash] = None
                freed += 1
        return freed

    def cached(self, block_hash: int) -> bool:
        """Whether the block is in the cache, in use or free."""
        return block_hash in self._in_use or block_hash in self._free

    def evict(self, blocks: int) -> tuple[int, ...]:
        """Drop up to `blocks` free cached blocks, least recently used first; those dropped."""
        return tuple(self._free.popitem(last=False)[0] for _ in range(min(blocks, len(self._free))))
