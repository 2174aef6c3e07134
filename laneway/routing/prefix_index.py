"""Which prompt prefixes each endpoint has served lately: an approximate index for affinity.

The gateway cannot see an engine's prefix cache, so it keeps its own estimate, as the
Gateway API Inference Extension's prefix scorer does in its "estimation mode": the prompt
is cut into blocks, each block's hash chained to the one before (so a block stands for the
whole prefix up to it), and every endpoint gets a bounded LRU of the block hashes of the
prompts routed to it. An engine evicts under memory pressure; the index evicts by its own
capacity, which should be about what one engine's KV cache holds, in index blocks.

Costs: one dict lookup per prompt block to match (the walk stops at the first block no
endpoint holds), one LRU touch per block to record; memory is bounded by endpoints times
capacity, not by how many sessions there are. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROOT_HASH = 0


def leading_block_hashes(
    items: str | tuple[int, ...], block_size: int, max_blocks: int
) -> tuple[int, ...]:
    """Chained hashes of the leading full blocks of `items`, at most `max_blocks`.

    The gateway hashes characters, not tokens: it often routes on token-count bounds without
    tokenizing, and a prefix of characters is a prefix of tokens up to the block's edge. The
    virtual runner, whose prompts are token ids, hashes those in blocks of the same size.
    Python's str hash is salted per process, so these hashes mean nothing across replicas.
    """
    blocks = min(len(items) // block_size, max_blocks)
    return chain_hashes(
        hash(items[start : start + block_size])
        for start in range(0, blocks * block_size, block_size)
    )


def chain_hashes(block_keys: Iterable[int]) -> tuple[int, ...]:
    """Chain per-block keys so that each stands for its block and everything before it."""
    chained: list[int] = []
    parent = ROOT_HASH
    for key in block_keys:
        parent = hash((parent, key))
        chained.append(parent)
    return tuple(chained)


@dataclass(frozen=True)
class KVEventSource:
    """A pool whose engines publish vLLM KV cache events (`--kv-events-config`) to the
    gateway: its endpoints' index entries come from them (exact), not from routing."""

    pool: str  # the InferencePool's name
    bind: str  # the ZMQ address the gateway's SUB socket binds; engines connect to it
    block_size: int = 16  # the engines' --block-size (vLLM's default on CUDA)


@dataclass(frozen=True)
class PrefixSettings:
    block_chars: int = 256  # characters per index block (about 64 tokens of prose)
    max_blocks: int = 128  # a prompt's leading blocks that are hashed, at most
    capacity_blocks: int = 16384  # blocks remembered per endpoint, least recent dropped
    # Forget an endpoint's blocks when its engine's prefix-cache counter goes backwards
    # (vLLM's vllm:prefix_cache_queries: the engine restarted with an empty cache).
    forget_on_engine_restart: bool = True
    kv_events: tuple[KVEventSource, ...] = ()

    def kv_events_of(self, pool: str) -> KVEventSource | None:
        return next((source for source in self.kv_events if source.pool == pool), None)


class PrefixIndex:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._slots: dict[str, int] = {}  # endpoint -> its bit in `_holders`
        self._lru: dict[str, OrderedDict[int, None]] = {}  # endpoint -> hashes, oldest first
        self._holders: dict[int, int] = {}  # block hash -> bitmask of endpoints holding it

    def matched_blocks(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per endpoint that holds any, how many of the prompt's leading blocks it holds."""
        matched: dict[str, int] = {}
        alive = (1 << len(self._slots)) - 1
        for depth, block_hash in enumerate(hashes):
            holders = self._holders.get(block_hash, 0) & alive
            if holders != alive:
                self._note_dropped(alive & ~holders, depth, matched)
                alive = holders
                if not alive:
                    return matched
        self._note_dropped(alive, len(hashes), matched)
        return matched

    def _note_dropped(self, slots_mask: int, depth: int, matched: dict[str, int]) -> None:
        if not depth or not slots_mask:
            return
        for url, slot in self._slots.items():
            if slots_mask >> slot & 1:
                matched[url] = depth

    def record(self, url: str, hashes: Sequence[int]) -> None:
        """The prompt with these block hashes was sent to `url`: it holds them, freshest."""
        slot = self._slots.get(url)
        if slot is None:
            slot = self._slots[url] = len(self._slots)
            self._lru[url] = OrderedDict()
        lru, bit = self._lru[url], 1 << slot
        for block_hash in hashes:
            if block_hash in lru:
                lru.move_to_end(block_hash)
            else:
                lru[block_hash] = None
                self._holders[block_hash] = self._holders.get(block_hash, 0) | bit
        while len(lru) > self.capacity_blocks:
            oldest, _ = lru.popitem(last=False)
            self._drop(oldest, bit)

    def remove(self, url: str, hashes: Iterable[int]) -> None:
        """The endpoint no longer holds these blocks (its engine said it evicted them)."""
        lru = self._lru.get(url)
        if lru is None:
            return
        bit = 1 << self._slots[url]
        for block_hash in hashes:
            if block_hash in lru:
                del lru[block_hash]
                self._drop(block_hash, bit)

    def forget(self, url: str) -> None:
        """The endpoint left (or restarted with an empty cache): drop what it held."""
        lru = self._lru.pop(url, None)
        if lru is None:
            return
        bit = 1 << self._slots[url]
        for block_hash in lru:
            self._drop(block_hash, bit)
        # Its slot stays reserved for it: reusing slots would need every mask rewritten.
        self._lru[url] = OrderedDict()

    def _drop(self, block_hash: int, bit: int) -> None:
        holders = self._holders[block_hash] & ~bit
        if holders:
            self._holders[block_hash] = holders
        else:
            del self._holders[block_hash]

    @property
    def blocks(self) -> int:
        return sum(len(lru) for lru in self._lru.values())

    def blocks_of(self, url: str) -> int:
        lru = self._lru.get(url)
        return len(lru) if lru is not None else 0


def estimated_cached_tokens(matched: int, hashed: int, prompt_tokens: int) -> int:
    """The prompt tokens an endpoint holding `matched` of the `hashed` leading blocks is
    likely to serve from its cache: the same share of the whole prompt (a long document
    whose hashed head matches is taken to match throughout)."""
    if not hashed:
        return 0
    return prompt_tokens * matched // hashed
