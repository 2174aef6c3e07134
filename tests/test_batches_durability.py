"""A gateway stopped mid-batch (SIGKILL or SIGTERM): its items are reclaimed, each written once."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import openai
import pytest
import redis
from support.fleet import chat_line, start_engines, start_gateway, wait_for, write_config

from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import LocalRedis

ITEMS = 24
QUEUE = "laneway:batch:queue:anonymous"


def consumer_of(pid: int) -> str:
    return f"{socket.gethostname()}-{pid}-"


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_items_of_a_stopped_gateway_complete_exactly_once(tmp_path: Path, stop: str) -> None:
    with LocalRedis() as server, Children() as children:
        # Real-time engines: each item takes a few tenths of a second, so the kill lands
        # while the doomed replica holds some.
        engines = start_engines(children, {"chat": 1, "documents": 2}, time_scale=1.0)
        config = write_config(tmp_path / "gateway.yaml", engines)
        flags = ["--batch-lease", "2", "--batch-concurrency", "3"]
        doomed = start_gateway(children, config, server.url, *flags, name="doomed")
        survivor = start_gateway(children, config, server.url, *flags, name="survivor")
        store = redis.Redis.from_url(server.url, decode_responses=True)

        source = "\n".join(
            chat_line(f"item-{i}", f"document {i}", max_tokens=48) for i in range(ITEMS)
        )
        with openai.OpenAI(base_url=f"{survivor.url}/v1", api_key="-", max_retries=0) as client:
            uploaded = client.files.create(file=("items.jsonl", source.encode()), purpose="batch")
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )

            def doomed_pending() -> int:
                consumers = store.xinfo_consumers(QUEUE, "dispatchers")
                mine = [c for c in consumers if c["name"].startswith(consumer_of(doomed.pid))]
                return int(mine[0]["pending"]) if mine else 0

            wait_for("the doomed replica to hold items", doomed_pending)
            if stop == "SIGKILL":
                doomed.kill_now()
                # What it held stays pending under its name: only a reclaim takes it over.
                assert doomed_pending() > 0
            else:
                # A clean stop: it claims nothing more, lets its running items finish while
                # it drains, and hands over what it held (marked idle for a lease).
                assert doomed.stop(grace=30) == 0
            progress = client.batches.retrieve(batch.id).request_counts
            assert progress is not None
            assert progress.completed < ITEMS  # killed mid-batch

            def finished() -> openai.types.Batch | None:
                current = client.batches.retrieve(batch.id)
                return current if current.status == "completed" else None

            done: openai.types.Batch = wait_for("the survivor to finish the batch", finished, 90)
            assert done.request_counts is not None
            assert (done.request_counts.completed, done.request_counts.failed) == (ITEMS, 0)
            assert done.output_file_id is not None
            lines = client.files.content(done.output_file_id).text.splitlines()
        custom_ids = [json.loads(line)["custom_id"] for line in lines]
        assert sorted(custom_ids) == sorted(f"item-{i}" for i in range(ITEMS))  # once each
        # Nothing is left pending, the dead replica's included.
        assert all(c["pending"] == 0 for c in store.xinfo_consumers(QUEUE, "dispatchers"))

        # The dead replica's share of endpoint load expired with its lease.
        def load_released() -> bool:
            totals: dict[str, str] = store.hgetall("laneway:load")  # type: ignore[assignment]
            return all(int(v) == 0 for v in totals.values())

        wait_for("the dead replica's load to expire", load_released)
        store.close()
