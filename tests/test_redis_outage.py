"""Redis restarted under traffic: chat keeps flowing, batches answer 503, then all recovers."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import openai
import pytest
from support.fleet import chat_line, metric, start_engines, start_gateway, wait_for, write_config

from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.state.redis_store import OutageLog
from laneway.simulator.seed import PUBLIC_MODEL


class ChatTraffic:
    """Chat requests one after another from a thread, each answer's status and end time."""

    def __init__(self, base_url: str) -> None:
        self._client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
        self._stop = threading.Event()
        self.answers: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._client.chat.completions.create(
                    model=PUBLIC_MODEL,
                    messages=[{"role": "user", "content": "still there?"}],
                    max_tokens=4,
                )
                status = 200
            except openai.APIStatusError as error:
                status = error.status_code
            self.answers.append((time.monotonic(), status))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._client.close()


def test_chat_survives_a_redis_restart_and_batches_come_back(tmp_path: Path) -> None:
    with LocalRedis() as server, Children() as children:
        engines = start_engines(children, {"chat": 1, "documents": 1}, time_scale=20.0)
        config = write_config(tmp_path / "gateway.yaml", engines)
        gateway = start_gateway(children, config, server.url, "--batch-lease", "2")
        base_url = f"{gateway.url}/v1"
        traffic = ChatTraffic(base_url)
        client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
        line = (chat_line("a", "hello") + "\n").encode()
        try:
            wait_for("chat traffic", lambda: len(traffic.answers) >= 3)
            server.stop()
            down_at = time.monotonic()
            with pytest.raises(openai.APIStatusError) as upload:
                client.files.create(file=("a.jsonl", line), purpose="batch")
            assert upload.value.status_code == 503
            assert int(upload.value.response.headers["retry-after"]) >= 1
            with pytest.raises(openai.APIStatusError) as lookup:
                # A well-formed id: a malformed one is refused before Redis is asked.
                client.batches.retrieve("batch_" + "0" * 32)
            assert lookup.value.status_code == 503
            wait_for("chat answers while Redis is down", lambda: _after(traffic, down_at) >= 5)
            assert metric(gateway, "laneway_gateway_redis_up") == 0
            server.start()  # same port, empty

            def upload_works() -> openai.types.FileObject | None:
                try:
                    return client.files.create(file=("a.jsonl", line), purpose="batch")
                except openai.APIStatusError as error:
                    if error.status_code != 503:
                        raise
                    return None

            uploaded: openai.types.FileObject = wait_for("uploads to work again", upload_works)
            wait_for("load sharing again", lambda: metric(gateway, "laneway_gateway_redis_up"))
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = wait_for(
                "the batch after the restart",
                lambda: client.batches.retrieve(batch.id).status == "completed",
            )
            assert done
        finally:
            traffic.stop()
            client.close()
        # Not one chat request failed, before, during or after the outage.
        assert {status for _, status in traffic.answers} == {200}
        assert _after(traffic, down_at) >= 5


def _after(traffic: ChatTraffic, moment: float) -> int:
    return sum(1 for at, _ in traffic.answers if at > moment)


def test_an_outage_is_logged_once_a_minute_with_what_to_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    outage = OutageLog("batch dispatch", every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="laneway.gateway.state.redis_store"):
        for second in range(120):  # a loop retrying every second for two minutes
            now[0] = float(second)
            outage.down(ConnectionRefusedError("Connect call failed"))
        outage.up()
        outage.up()  # no outage, nothing to say
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3
    assert all(line.startswith("laneway gateway: ") for line in lines)
    assert "check that Redis is running and that --redis-url points at it" in lines[0]
    assert lines[2] == "laneway gateway: redis answers again, batch dispatch resumed"
