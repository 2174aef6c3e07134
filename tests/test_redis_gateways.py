"""Two gateway processes on one Redis: shared endpoint load, shared tenant limits, batches.

Real `laneway sim` engines, real `laneway gateway` processes, a real redis-server and the
official openai client.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis
from support.fleet import (
    chat_line,
    finished_requests,
    http,
    metric,
    running_requests,
    start_engines,
    start_gateway,
    wait_for,
    write_config,
)

from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.redis_server import LocalRedis
from laneway.simulator.seed import PUBLIC_MODEL

TENANTS = """
tenants:
  - name: streams
    apiKeys: [sk-streams]
  - name: limited
    apiKeys: [sk-limited]
    requestsPerMinute: 6
  - name: frugal
    apiKeys: [sk-frugal]
    tokensPerMinute: 400
  - name: batcher
    apiKeys: [sk-batcher]
  - name: other
    apiKeys: [sk-other]
"""
MAX_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Fleet:
    redis: LocalRedis
    engines: dict[str, list[ChildProcess]]
    gateways: tuple[ChildProcess, ChildProcess]

    def client(self, gateway: int, key: str) -> openai.OpenAI:
        url = self.gateways[gateway].url
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("fleet")
    tenants = folder / "tenants.yaml"
    tenants.write_text(TENANTS)
    with LocalRedis() as server, Children() as children:
        # Real-time engines, so that streams stay open while the test looks at them.
        engines = start_engines(children, {"chat": 3, "documents": 1}, time_scale=1.0)
        config = write_config(folder / "gateway.yaml", engines)
        extra = ["--tenants", str(tenants), "--max-file-bytes", str(MAX_FILE_BYTES)]
        gateways = (
            start_gateway(children, config, server.url, *extra, name="gateway-a"),
            start_gateway(children, config, server.url, *extra, name="gateway-b"),
        )
        yield Fleet(server, engines, gateways)


def test_two_gateways_spread_streams_over_engines_by_their_shared_load(fleet: Fleet) -> None:
    """Streams through A and B alternately: each pick sees the other replica's streams."""
    clients = [fleet.client(0, "sk-streams"), fleet.client(1, "sk-streams")]
    with contextlib.ExitStack() as open_streams:
        for turn in range(6):
            stream = clients[turn % 2].chat.completions.create(
                model=PUBLIC_MODEL,
                messages=[{"role": "user", "content": f"tell me a long story, part {turn}"}],
                max_tokens=3000,
                stream=True,
            )
            open_streams.enter_context(stream)
            next(iter(stream))  # the first chunk: the stream is running on an engine
            # Each replica alone would see only its own streams and could double up.
            wait_for(
                f"{turn + 1} streams spread evenly",
                functools.partial(_evenly_spread, fleet, turn + 1),
            )
        shared = redis.Redis.from_url(fleet.redis.url, decode_responses=True)
        totals: dict[str, str] = shared.hgetall("laneway:load")  # type: ignore[assignment]
        shared.close()
        assert sum(int(v) for k, v in totals.items() if k.endswith("|in_flight")) == 6
    for client in clients:
        client.close()


def _evenly_spread(fleet: Fleet, streams: int) -> bool:
    """Every engine runs streams // engines or one more: no engine got a second too soon."""
    chat = fleet.engines["chat"]
    running = [running_requests(engine) for engine in chat]
    fewest = streams // len(chat)
    return sum(running) == streams and all(fewest <= r <= fewest + 1 for r in running)


def test_tenant_limits_hold_across_both_gateways(fleet: Fleet) -> None:
    clients = [fleet.client(0, "sk-limited"), fleet.client(1, "sk-limited")]
    answers: list[int] = []
    refusals: list[openai.RateLimitError] = []
    for turn in range(10):
        try:
            clients[turn % 2].chat.completions.create(
                model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            answers.append(200)
        except openai.RateLimitError as error:
            answers.append(error.status_code)
            refusals.append(error)
    # Six per minute in all, whichever replica took them.
    assert answers == [200] * 6 + [429] * 4
    refused = [
        metric(g, "laneway_gateway_tenant_refusals_total", tenant="limited", reason="requests")
        for g in fleet.gateways
    ]
    assert refused == [2, 2]  # each replica counts the refusals it answered
    for refusal in refusals:
        assert int(refusal.response.headers["retry-after"]) >= 1
        assert refusal.code == "rate_limit_exceeded"
        assert "6 requests per minute" in refusal.message
    for client in clients:
        client.close()


def test_a_request_larger_than_the_token_limit_is_refused_without_retry_after(
    fleet: Fleet,
) -> None:
    with fleet.client(1, "sk-frugal") as client, pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=500
        )
    assert caught.value.code == "tokens_exceed_limit"
    assert "retry-after" not in caught.value.response.headers


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "You didn't provide an API key"),
        ({"Authorization": "Bearer sk-wrong"}, "Incorrect API key provided"),
        ({"Authorization": "Basic sk-limited"}, "Incorrect API key provided"),
    ],
)
def test_a_missing_or_unknown_key_gets_401(
    fleet: Fleet, headers: dict[str, str], message: str
) -> None:
    body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for gateway in fleet.gateways:
        status, answer, _ = http("POST", f"{gateway.url}/v1/chat/completions", body, headers)
        assert status == 401
        error = answer["error"]
        assert error["code"] == "invalid_api_key"
        assert message in error["message"]
    # Health and metrics stay open to probes and scrapers.
    assert http("GET", f"{fleet.gateways[0].url}/healthz")[0] == 200
    name, labels = "laneway_gateway_tenant_refusals_total", {"reason": "unauthenticated"}
    assert all(metric(g, name, **labels) >= 1 for g in fleet.gateways)
    assert all(metric(g, "laneway_gateway_redis_up") == 1 for g in fleet.gateways)


def test_the_openai_client_runs_a_batch_to_completion(fleet: Fleet, tmp_path: Path) -> None:
    lines = [chat_line(f"doc-{i}", f"summarize item {i}") for i in range(12)]
    lines.insert(4, '{"custom_id": "broken", "method": "POST", "url": ')  # malformed JSON
    lines.insert(8, chat_line("doc-3", "a second doc-3"))  # a duplicate custom_id
    source = tmp_path / "input.jsonl"
    source.write_text("\n".join(lines) + "\n")
    batch_engine = fleet.engines["documents"][0]
    finished_before = finished_requests(batch_engine)
    with fleet.client(0, "sk-batcher") as uploader, fleet.client(1, "sk-batcher") as watcher:
        uploaded = uploader.files.create(file=(source.name, source.read_bytes()), purpose="batch")
        assert uploaded.bytes == source.stat().st_size
        assert watcher.files.retrieve(uploaded.id).filename == "input.jsonl"
        batch = uploader.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"job": "nightly"},
        )
        assert batch.request_counts is not None
        assert batch.request_counts.total == 14

        def finished() -> openai.types.Batch | None:
            current = watcher.batches.retrieve(batch.id)
            return current if current.status == "completed" else None

        done: openai.types.Batch = wait_for("the batch to complete", finished)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (12, 2)
        assert done.metadata == {"job": "nightly"}
        assert done.output_file_id is not None
        assert done.error_file_id is not None
        output = [
            json.loads(x) for x in watcher.files.content(done.output_file_id).text.splitlines()
        ]
        errors = [
            json.loads(x) for x in watcher.files.content(done.error_file_id).text.splitlines()
        ]
        assert sorted(x["custom_id"] for x in output) == sorted(f"doc-{i}" for i in range(12))
        for line in output:
            assert line["error"] is None
            assert line["response"]["status_code"] == 200
            assert line["response"]["body"]["usage"]["completion_tokens"] == 8
        # Every item ran in the batch lane, on its engine, though its prompt is short.
        assert finished_requests(batch_engine) - finished_before == 12
        settled = sum(
            metric(g, "laneway_gateway_batch_items_total", outcome="completed")
            for g in fleet.gateways
        )
        assert settled >= 12  # by whichever replica was free
        by_line = {x["error"]["line"]: x for x in errors}
        assert by_line[5]["error"]["code"] == "invalid_json"
        assert by_line[5]["custom_id"] is None
        assert by_line[9]["error"]["code"] == "duplicate_custom_id"
        assert all(x["response"] is None for x in errors)
        listed = watcher.batches.list(limit=5)
        assert batch.id in [b.id for b in listed.data]
        inputs = [f.id for f in watcher.files.list(purpose="batch")]
        outputs = [f.id for f in watcher.files.list(purpose="batch_output")]
        assert uploaded.id in inputs
        assert {done.output_file_id, done.error_file_id} <= set(outputs)
        assert uploaded.id not in outputs
        output_file = watcher.files.retrieve(done.output_file_id)
        assert output_file.purpose == "batch_output"


def test_batches_and_files_are_private_to_their_tenant(fleet: Fleet, tmp_path: Path) -> None:
    source = tmp_path / "one.jsonl"
    source.write_text(chat_line("only", "hello") + "\n")
    with fleet.client(0, "sk-batcher") as owner, fleet.client(1, "sk-other") as stranger:
        uploaded = owner.files.create(file=(source.name, source.read_bytes()), purpose="batch")
        batch = owner.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with pytest.raises(openai.NotFoundError):
            stranger.files.retrieve(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            stranger.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            stranger.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        assert batch.id not in [b.id for b in stranger.batches.list().data]
        assert uploaded.id not in [f.id for f in stranger.files.list()]
        with pytest.raises(openai.NotFoundError):
            stranger.files.delete(uploaded.id)
        assert owner.files.delete(uploaded.id).deleted
        with pytest.raises(openai.NotFoundError):
            owner.files.retrieve(uploaded.id)


def test_unknown_ids_oversized_files_and_bad_requests(fleet: Fleet, tmp_path: Path) -> None:
    with fleet.client(0, "sk-batcher") as client:
        with pytest.raises(openai.NotFoundError) as missing_file:
            client.files.retrieve("file-nope")
        assert missing_file.value.code == "file_not_found"
        with pytest.raises(openai.NotFoundError):
            client.files.content("file-nope")
        with pytest.raises(openai.NotFoundError) as missing_batch:
            client.batches.retrieve("batch_nope")
        assert missing_batch.value.code == "batch_not_found"
        with pytest.raises(openai.NotFoundError):
            client.batches.cancel("batch_nope")
        big = tmp_path / "big.jsonl"
        line = chat_line("x", "y" * 1000)
        big.write_text("\n".join(line for _ in range(MAX_FILE_BYTES // len(line) + 2)))
        with pytest.raises(openai.APIStatusError) as too_large:
            client.files.create(file=(big.name, big.read_bytes()), purpose="batch")
        assert too_large.value.status_code == 413
        small = tmp_path / "small.jsonl"
        small.write_text(chat_line("x", "y"))
        with pytest.raises(openai.BadRequestError) as wrong_purpose:
            client.files.create(file=(small.name, small.read_bytes()), purpose="fine-tune")
        assert wrong_purpose.value.param == "purpose"
        uploaded = client.files.create(file=(small.name, small.read_bytes()), purpose="batch")
        with pytest.raises(openai.BadRequestError) as wrong_endpoint:
            client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/embeddings",
                completion_window="24h",
            )
        assert wrong_endpoint.value.param == "endpoint"
