"""The engines' own prefix-cache state, from vLLM's KV cache events: the exact feed.

vLLM started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "topic": "kv-events"}'` publishes what its prefix cache stores
and evicts (`vllm/distributed/kv_events.py`, `vllm/config/kv_events.py`). Each ZMQ message
has three frames: the topic, an 8-byte big-endian sequence number, and a msgpack
`KVEventBatch` `[ts, [event, ...], data_parallel_rank]`. An event is a msgspec tagged struct:
in the array layout of vLLM 0.9-0.11 `["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, ...]`, `["BlockRemoved", block_hashes, medium]`,
`["AllBlocksCleared"]`; later releases encode events as maps with the tag under "type".
Both layouts are read here.

vLLM's block hashes are sha256 (or Python's salted hash) over the parent hash, the block's
token ids and extra keys, seeded per process (`NONE_HASH`), so a gateway cannot recompute
them. It does not need to: BlockStored carries the blocks' token ids and their parent, so
the gateway re-keys every stored block with its own chain over token ids
(`token_block_keys`) and keeps, per engine, which of its hashes stand for which keys. A
prompt then matches when the gateway renders it to the same token ids as the engine, which
holds when the pool's tokenizer is the engine's and the chat framing is the same.

Pure: decoded events in, index updates out; the socket lives in the gateway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laneway.routing.prefix_index import ROOT_HASH, PrefixIndex

EngineHash = int | bytes


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None  # None: the first block stored follows no other
    token_ids: tuple[int, ...]  # block_size ids per block, in order
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventError(ValueError):
    """The message is not a vLLM KV event batch."""


def token_block_keys(
    token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH
) -> tuple[int, ...]:
    """The gateway's chained key of every full block of `token_ids` (as the engine caches
    them); `parent` continues a chain from the key of the block before."""
    keys: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return tuple(keys)


def parse_event_batch(batch: Any) -> list[KVEvent]:
    """The events of one unpacked `KVEventBatch`; unknown event kinds are skipped, as a
    newer engine may add some."""
    if not isinstance(batch, list | tuple) or len(batch) < 2:
        raise KVEventError("a KV event batch is an array [ts, events, ...]")
    events = batch[1]
    if not isinstance(events, list | tuple):
        raise KVEventError("a KV event batch's events must be an array")
    parsed = [_event(raw) for raw in events]
    return [event for event in parsed if event is not None]


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


def _event(raw: Any) -> KVEvent | None:
    if isinstance(raw, Mapping):
        tag, values = raw.get("type"), raw
    elif isinstance(raw, list | tuple) and raw:
        tag = raw[0]
        names = _FIELDS.get(tag, ()) if isinstance(tag, str) else ()
        values = dict(zip(names, raw[1:], strict=False))
    else:
        raise KVEventError(f"a KV event must be a tagged array or map, got {raw!r:.80}")
    try:
        if tag == "BlockStored":
            return BlockStored(
                block_hashes=tuple(values["block_hashes"]),
                parent_block_hash=values["parent_block_hash"],
                token_ids=tuple(values["token_ids"]),
                block_size=int(values["block_size"]),
            )
        if tag == "BlockRemoved":
            return BlockRemoved(block_hashes=tuple(values["block_hashes"]))
    except (KeyError, TypeError, ValueError) as error:
        raise KVEventError(f"malformed {tag} event: {error}") from None
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


class EngineBlockFeed:
    """Applies one engine's events to the gateway's exact index, under the engine's URL.

    `_keys` maps the engine's hash of each block it holds to the gateway's key for it, so
    that a later block can chain from its parent and a removal can find what to drop. A
    block whose parent the gateway never saw stored (events missed before it subscribed)
    cannot be keyed and is left out: the index under-reports, never invents a hit.
    """

    def __init__(self, url: str, index: PrefixIndex) -> None:
        self.url, self._index = url, index
        self._keys: dict[EngineHash, int] = {}

    def apply(self, events: Iterable[KVEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                keys = [self._keys.pop(h) for h in event.block_hashes if h in self._keys]
                self._index.remove(self.url, keys)
            else:
                self._keys.clear()
                self._index.forget(self.url)

    def _stored(self, event: BlockStored) -> None:
        if event.parent_block_hash is None:
            parent = ROOT_HASH
        elif event.parent_block_hash in self._keys:
            parent = self._keys[event.parent_block_hash]
        else:
            return
        keys = token_block_keys(event.token_ids, event.block_size, parent)
        for engine_hash, key in zip(event.block_hashes, keys, strict=False):
            self._keys[engine_hash] = key
        self._index.record(self.url, keys)


def cached_tokens(matched_blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Prompt tokens an engine serves from its cache: whole matched blocks, and never the
    last prompt token, which it always computes for the logits (as `prefix_cache.py` says)."""
    return min(matched_blocks * block_size, max(prompt_tokens - 1, 0))
