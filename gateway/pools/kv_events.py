"""The engines' KV cache events into the prefix index (`spec.picking.prefix.kvEvents`).

Per configured pool the gateway binds one ZMQ SUB socket; the pool's engines connect to it
(vLLM's `--kv-events-config` with an `endpoint` without `*` connects: "bind stable,
connect volatile") and publish under the topic `kv@<host:port>[@...]`, naming the
endpoint they serve, as llm-d names its pods' topics (`kv@<pod-ip>@<model>`). One socket
hears every engine of the pool; the topic says whose events a message carries.

A message that cannot be read is logged and skipped: the index then under-reports for that
engine, which costs hits, never correctness. Sequence gaps (dropped at the high-water mark)
are not replayed; the blocks they stored are missed the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from laneway.errors import UsageError, missing_extra
from laneway.ledger import Ledger
from laneway.routing.kv_events import (
    BlockStored,
    KVEvent,
    KVEventError,
    parse_event_batch,
)
from laneway.routing.prefix_index import KVEventSource

log = logging.getLogger(__name__)
TOPIC_PREFIX = b"kv@"


def endpoint_of_topic(topic: bytes, endpoints: Iterable[str]) -> str | None:
    """The endpoint whose host:port the topic `kv@<host:port>[@...]` names, if any."""
    fields = topic.decode(errors="replace").split("@")
    if len(fields) < 2 or fields[0] != "kv":
        return None
    return next((url for url in endpoints if fields[1] in _host_ports(url)), None)


def _host_ports(url: str) -> tuple[str, str]:
    """The ways a topic may name an endpoint: its URL's host:port, and for an IPv6 host the
    same without brackets, as the operator's `kv@$(pod IP):<port>` renders it."""
    parts = urlsplit(url)
    return parts.netloc, f"{parts.hostname}:{parts.port}"


class KVEventSubscriber:
    """One pool's SUB socket, bound at construction (a taken address fails the start)."""

    def __init__(self, source: KVEventSource, ledger: Ledger) -> None:
        try:
            import msgpack
            import zmq
            import zmq.asyncio
        except ImportError as error:
            raise missing_extra("spec.picking.prefix.kvEvents", "kvevents", error) from None

        self.source, self._ledger = source, ledger
        self._unpack = msgpack.unpackb
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.SUB)
        try:
            self._socket.bind(source.bind)
        except zmq.ZMQError as error:
            self.close()
            raise UsageError(
                f"spec.picking.prefix.kvEvents: pool {source.pool} cannot bind "
                f"{source.bind}: {error}"
            ) from None
        self._socket.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
        self._misfits: set[str] = set()  # engines already warned about their block size

    async def run(self) -> None:
        """Apply the pool's engines' events to the index until cancelled."""
        while True:
            self.receive(await self._socket.recv_multipart())

    def receive(self, frames: Sequence[bytes]) -> None:
        source = self.source
        pool = next((p for p in self._ledger.pools() if p.name == source.pool), None)
        url = endpoint_of_topic(frames[0], pool.endpoints if pool else ())
        if url is None or len(frames) != 3:
            log.warning("kv events on %s: skipped a message for %r", source.bind, frames[0])
            return
        try:
            events = parse_event_batch(self._unpack(frames[2]))
        except (KVEventError, ValueError, TypeError) as error:
            log.warning("kv events from %s: %s", url, error)
            return
        if url not in self._misfits:
            self._check_block_size(url, events)
        self._ledger.record_kv_events(url, events)

    def _check_block_size(self, url: str, events: Sequence[KVEvent]) -> None:
        """Blocks of another size than the entry's never match a prompt cut into blockSize
        blocks, so the pool would quietly get no affinity: say so, once per engine."""
        wanted = self.source.block_size
        size = next(
            (e.block_size for e in events if isinstance(e, BlockStored) and e.block_size != wanted),
            None,
        )
        if size is not None:
            self._misfits.add(url)
            log.warning(
                "kv events from %s: the engine stores %d-token blocks, but "
                "spec.picking.prefix.kvEvents gives pool %s blockSize %d, so none of its blocks "
                "can match a prompt: make the two the same (the engine's --block-size, "
                "spec.engine.kvEvents.blockSize on an operator-run pool)",
                url,
                size,
                self.source.pool,
                wanted,
            )

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
