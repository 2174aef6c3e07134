"""The chaos run's clients: chat sessions and document senders spread over both replicas
with failover, and one Batches API job followed to its end and checked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Mapping
from typing import Any

import aiohttp

from laneway.bench.chaos.accounting import BatchCheck, ChaosRecord, check_batch, error_line_code
from laneway.bench.chaos.fleet import Clock, Fleet
from laneway.bench.chaos.options import CHAT, DOCUMENT, REPLICAS, ChaosOptions
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.stream import StreamResult, stream_request
from laneway.errors import ChildError
from laneway.simulator.seed import PUBLIC_MODEL
from laneway.tokens import default_tokenizer


class Clients:
    """Chat sessions and document senders spread over both replicas, with failover."""

    def __init__(self, fleet: Fleet, options: ChaosOptions, clock: Clock) -> None:
        self._fleet = fleet
        self._options = options
        self._clock = clock
        self._prompts = PromptFactory(default_tokenizer())
        self.records: list[ChaosRecord] = []

    async def run(self, session: aiohttp.ClientSession) -> None:
        options = self._options
        workers = [self._chat(session, index) for index in range(options.sessions)]
        workers += [self._documents(session, index) for index in range(options.documents)]
        await asyncio.gather(*workers)

    async def _chat(self, session: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(f"{self._options.seed}/chat/{index}")
        await asyncio.sleep(rng.uniform(0, 1.0))
        while self._clock.now() < self._options.duration_s:
            body = {
                "model": PUBLIC_MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": self._prompts.chat_content(rng, rng.randint(200, 1500)),
                    }
                ],
                "max_tokens": rng.randint(50, 250),
                "stream": True,
            }
            await self._send(session, CHAT, index, "/v1/chat/completions", body)
            await asyncio.sleep(rng.uniform(0.5, 1.5))

    async def _documents(self, session: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(f"{self._options.seed}/document/{index}")
        await asyncio.sleep(rng.uniform(0, 2.0))
        while self._clock.now() < self._options.duration_s:
            prompt = await asyncio.to_thread(
                self._prompts.text, rng, rng.choice((16_384, 32_768, 49_152))
            )
            body = {
                "model": PUBLIC_MODEL,
                "prompt": prompt,
                "max_tokens": rng.randint(64, 128),
                "stream": True,
            }
            await self._send(session, DOCUMENT, index, "/v1/completions", body)
            await asyncio.sleep(rng.uniform(1.0, 3.0))

    async def _send(
        self,
        session: aiohttp.ClientSession,
        kind: str,
        index: int,
        path: str,
        body: Mapping[str, Any],
    ) -> None:
        home = REPLICAS[index % len(REPLICAS)]
        order = (home, *(r for r in REPLICAS if r != home))
        started = self._clock.now()
        failed_over = False
        for attempt, replica in enumerate(order):
            try:
                result = await stream_request(session, self._fleet.urls[replica] + path, body)
            except aiohttp.ClientConnectorError as error:
                # Refused: the request never reached a process, so another replica may take it.
                if attempt + 1 < len(order):
                    failed_over = True
                    continue
                self._failed(kind, replica, failed_over, started, f"refused: {error}")
                return
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                self._failed(kind, replica, failed_over, started, type(error).__name__)
                return
            self._record(kind, replica, failed_over, started, result)
            return

    def _record(
        self, kind: str, replica: str, failed_over: bool, started: float, result: StreamResult
    ) -> None:
        self.records.append(
            ChaosRecord(
                kind=kind,
                replica=replica,
                pool=result.headers.get("x-laneway-pool"),
                failed_over=failed_over,
                started_s=started,
                ended_s=self._clock.now(),
                status=result.status,
                error=result.error,
                error_code=result.error_code,
                ttft_s=result.ttft_s,
            )
        )

    def _failed(
        self, kind: str, replica: str, failed_over: bool, started: float, error: str
    ) -> None:
        self.records.append(
            ChaosRecord(
                kind=kind,
                replica=replica,
                pool=None,
                failed_over=failed_over,
                started_s=started,
                ended_s=self._clock.now(),
                status=0,
                error=error,
                error_code=None,
                ttft_s=None,
            )
        )


class Batch:
    """One Batches API job: upload, create, poll, and check its files."""

    def __init__(self, fleet: Fleet, options: ChaosOptions) -> None:
        self._fleet = fleet
        self._prompts = PromptFactory(default_tokenizer())
        self.custom_ids = [f"item-{i}" for i in range(options.items)]
        rng = random.Random(f"{options.seed}/batch")
        self._lines = [
            json.dumps(
                {
                    "custom_id": custom_id,
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": PUBLIC_MODEL,
                        "messages": [
                            {
                                "role": "user",
                                "content": self._prompts.chat_content(rng, rng.randint(200, 800)),
                            }
                        ],
                        "max_tokens": 256,
                    },
                }
            )
            for custom_id in self.custom_ids
        ]
        self.batch_id: str | None = None
        self.progress = "not created"
        self.record: dict[str, Any] = {}
        self.finished_at_s: float | None = None

    async def _call(
        self, session: aiohttp.ClientSession, method: str, path: str, **kwargs: Any
    ) -> tuple[int, bytes] | None:
        """(status, body) from the first replica that answers; None when neither does."""
        for replica in REPLICAS:
            try:
                async with session.request(
                    method,
                    self._fleet.urls[replica] + path,
                    timeout=aiohttp.ClientTimeout(total=30),
                    **kwargs,
                ) as reply:
                    return reply.status, await reply.read()
            except (aiohttp.ClientError, TimeoutError):
                continue
        return None

    async def _ok(
        self, session: aiohttp.ClientSession, what: str, method: str, path: str, **kwargs: Any
    ) -> bytes:
        """The body of a call that must succeed now; ChildError saying why it did not."""
        answer = await self._call(session, method, path, **kwargs)
        if answer is None:
            raise ChildError(f"no gateway replica answered while the bench {what}")
        status, body = answer
        if status != 200:
            text = body.decode("utf-8", "replace")[:300]
            raise ChildError(f"a gateway replica answered {status} when the bench {what}: {text}")
        return body

    async def create(self, session: aiohttp.ClientSession) -> None:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", "\n".join(self._lines).encode(), filename="chaos.jsonl")
        uploaded = json.loads(
            await self._ok(session, "uploaded the batch input", "POST", "/v1/files", data=form)
        )
        body = {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        created = json.loads(
            await self._ok(session, "created the batch", "POST", "/v1/batches", json=body)
        )
        self.batch_id = created["id"]
        self.record = created

    async def follow(
        self, session: aiohttp.ClientSession, stop: asyncio.Event, clock: Clock
    ) -> None:
        """Poll until the batch finishes (or `stop`), keeping the last record seen."""
        while self.finished_at_s is None and not stop.is_set():
            # No answer or not 200 (a replica killed, Redis down): ask again in a second.
            answer = await self._call(session, "GET", f"/v1/batches/{self.batch_id}")
            if answer is not None and answer[0] == 200:
                record = json.loads(answer[1])
                self.record = record
                counts = record.get("request_counts") or {}
                self.progress = (
                    f"{record['status']} {counts.get('completed', 0)}+"
                    f"{counts.get('failed', 0)}/{counts.get('total', '?')}"
                )
                if record["status"] in ("completed", "failed", "expired", "cancelled"):
                    self.finished_at_s = clock.now()
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def check(self, session: aiohttp.ClientSession) -> BatchCheck:
        output = await self._lines_of(session, self.record.get("output_file_id"))
        errors = await self._lines_of(session, self.record.get("error_file_id"))
        return check_batch(
            self.custom_ids,
            [str(line.get("custom_id")) for line in output],
            [str(line.get("custom_id")) for line in errors],
            [error_line_code(line) for line in errors],
            str(self.record.get("status", "unknown")),
            self.finished_at_s,
        )

    async def _lines_of(
        self, session: aiohttp.ClientSession, file_id: str | None
    ) -> list[dict[str, Any]]:
        if not file_id:
            return []
        content = await self._ok(
            session, f"read the batch's file {file_id}", "GET", f"/v1/files/{file_id}/content"
        )
        return [json.loads(line) for line in content.decode().splitlines() if line.strip()]
