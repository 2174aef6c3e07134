"""`laneway sim --kv-events-config`: the prefix cache's changes published as vLLM does.

vLLM (`vllm/config/kv_events.py`, `vllm/distributed/kv_events.py`) takes a JSON object:
`enable_kv_cache_events`, `publisher` ("null" or "zmq"; "zmq" when events are enabled),
`endpoint` (default `tcp://*:5557`; bound when it holds `*`, `::`, or is ipc/inproc,
otherwise connected), `topic` (default ""), `hwm` (the PUB socket's high-water mark),
`replay_endpoint`, `buffer_steps` and `max_queue_size`. After each engine step the
scheduler's new events go out as one batch: a three-frame ZMQ message of the topic, an
8-byte big-endian sequence number and the msgpack `KVEventBatch` `[ts, [event, ...],
data_parallel_rank]`, each event a tagged array in the layout of vLLM 0.9-0.11
(`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium]`, `["BlockRemoved", block_hashes, medium]`).

The block hashes are the simulator's own (`prefix_cache.block_hashes`), as vLLM's are its
own: consumers key blocks by the token ids the events carry. Not simulated: the replay
socket (a `replay_endpoint` is refused rather than silently ignored) and data-parallel
ranks (always 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from laneway.errors import UsageError, missing_extra
from laneway.simulator.engine import BlocksEvicted, CacheEvent
from laneway.simulator.scheduler import KV_BLOCK_TOKENS

MEDIUM_GPU = "GPU"
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "enable_kv_cache_events": bool,
    "publisher": str,
    "endpoint": str,
    "replay_endpoint": (str, type(None)),
    "buffer_steps": int,
    "hwm": int,
    "max_queue_size": int,
    "topic": str,
}


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str = "tcp://*:5557"
    topic: str = ""
    hwm: int = 100_000


def parse_kv_events_config(text: str) -> KVEventsConfig | None:
    """The flag's JSON as vLLM reads it; None when events are off. UsageError when wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--kv-events-config is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise UsageError("--kv-events-config must be a JSON object")
    for name, value in data.items():
        kind = _FIELDS.get(name)
        if kind is None:
            raise UsageError(
                f"--kv-events-config has no field {name!r}; known: {', '.join(_FIELDS)}"
            )
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UsageError(f"--kv-events-config field {name!r} has the wrong type: {value!r}")
    if data.get("replay_endpoint") is not None:
        raise UsageError("--kv-events-config: the simulator does not serve a replay_endpoint")
    enabled = data.get("enable_kv_cache_events", False)
    publisher = data.get("publisher", "zmq" if enabled else "null")
    if publisher not in ("null", "zmq"):
        raise UsageError(f"--kv-events-config publisher must be 'null' or 'zmq', got {publisher!r}")
    if not enabled or publisher == "null":
        return None
    default = KVEventsConfig()
    config = KVEventsConfig(
        endpoint=data.get("endpoint", default.endpoint),
        topic=data.get("topic", default.topic),
        hwm=data.get("hwm", default.hwm),
    )
    if not config.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise UsageError(
            f"--kv-events-config endpoint must be a ZMQ address, got {config.endpoint!r}"
        )
    return config


def wire_events(
    events: Sequence[CacheEvent], token_ids: Callable[[str], Sequence[int] | None]
) -> list[list[Any]]:
    """The engine's journal as vLLM's events; `token_ids` gives a live request's prompt ids
    (a run of a request already gone cannot be described and is left out)."""
    wired: list[list[Any]] = []
    for event in events:
        if isinstance(event, BlocksEvicted):
            wired.append(["BlockRemoved", list(event.hashes), MEDIUM_GPU])
            continue
        ids = token_ids(event.request_id)
        if ids is None:
            continue
        start = event.first * KV_BLOCK_TOKENS
        tokens = list(ids[start : start + len(event.hashes) * KV_BLOCK_TOKENS])
        wired.append(
            ["BlockStored", list(event.hashes), event.parent, tokens, KV_BLOCK_TOKENS, None,
             MEDIUM_GPU]
        )  # fmt: skip
    return wired


class ZmqEventPublisher:
    """A PUB socket sending one batch per engine step, numbered from 0."""

    def __init__(self, config: KVEventsConfig) -> None:
        try:
            import msgpack
            import zmq
        except ImportError as error:
            raise missing_extra("--kv-events-config", "kvevents", error) from None

        self._pack = msgpack.packb
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(config.hwm)
        endpoint = config.endpoint
        try:
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
                self._socket.bind(endpoint)
            else:
                self._socket.connect(endpoint)
        except zmq.ZMQError as error:
            self.close()
            raise UsageError(f"--kv-events-config endpoint {endpoint}: {error}") from None
        self._topic = config.topic.encode()
        self._sequence = 0

    def publish(self, events: list[list[Any]]) -> None:
        # A PUB socket never blocks: past the high-water mark it drops, and the sequence
        # number shows subscribers the gap.
        payload = self._pack([time.time(), events, 0])
        self._socket.send_multipart((self._topic, self._sequence.to_bytes(8, "big"), payload))
        self._sequence += 1

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
