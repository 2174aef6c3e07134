"""`laneway sim --kv-events-config`: vLLM's flag read as vLLM reads it, and the engine's
journal turned into vLLM's wire events."""

from __future__ import annotations

import pytest

from laneway.errors import UsageError
from laneway.routing.kv_events import BlockRemoved, BlockStored, parse_event_batch
from laneway.simulator.engine import BlocksCached, BlocksEvicted, CacheEvent
from laneway.simulator.kv_events import KVEventsConfig, parse_kv_events_config, wire_events


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}", None),  # events off by default
        ('{"enable_kv_cache_events": true, "publisher": "null"}', None),
        ('{"enable_kv_cache_events": true}', KVEventsConfig()),  # zmq, tcp://*:5557, ""
        (
            '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:7000", '
            '"topic": "kv@127.0.0.1:8000", "hwm": 10, "buffer_steps": 5}',
            KVEventsConfig(endpoint="tcp://127.0.0.1:7000", topic="kv@127.0.0.1:8000", hwm=10),
        ),
    ],
)
def test_the_flag_reads_vllm_fields(text: str, expected: KVEventsConfig | None) -> None:
    assert parse_kv_events_config(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"enable_kv_cache_events": true, "endpiont": "x"}', "has no field 'endpiont'"),
        ('{"enable_kv_cache_events": "yes"}', "'enable_kv_cache_events' has the wrong type"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "must be 'null' or 'zmq'"),
        ('{"enable_kv_cache_events": true, "endpoint": "localhost:1"}', "must be a ZMQ address"),
        (
            '{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5558"}',
            "does not serve a replay_endpoint",
        ),
    ],
)
def test_a_wrong_flag_is_a_usage_error(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_kv_events_config(text)


def test_the_journal_goes_out_as_events_a_vllm_consumer_reads() -> None:
    ids = list(range(1000, 1048))
    journal: list[CacheEvent] = [
        BlocksCached(request_id="r1", first=1, hashes=(11, 12), parent=10),
        BlocksEvicted((7,)),
        BlocksCached(request_id="gone", first=0, hashes=(5,), parent=None),
    ]
    wired = wire_events(journal, lambda rid: ids if rid == "r1" else None)
    assert parse_event_batch([0.0, wired, 0]) == [
        BlockStored(
            block_hashes=(11, 12), parent_block_hash=10, token_ids=tuple(ids[16:48]), block_size=16
        ),
        BlockRemoved((7,)),
    ]  # the finished request's run cannot be described: left out
