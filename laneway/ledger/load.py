"""In-flight load per endpoint: requests sent and not finished, and the prompt tokens sent
whose first token has not come back (what delays the next request's first token there).

This replica's own counts change only through the ledger's request life; other gateway
replicas' counts arrive as data (`set_peers`, from the Redis shell), and a pick sees the sum.
"""

from __future__ import annotations

from collections.abc import Mapping

from laneway.routing.cycle import EndpointLoad

IDLE = EndpointLoad()


class LoadBook:
    def __init__(self) -> None:
        self._own: dict[str, EndpointLoad] = {}
        self._peers: Mapping[str, EndpointLoad] = {}

    def start(self, url: str, prefill_tokens: int) -> None:
        self._add(url, requests=1, prefill_tokens=prefill_tokens)

    def prefill_done(self, url: str, prefill_tokens: int) -> None:
        self._add(url, requests=0, prefill_tokens=-prefill_tokens)

    def finish(self, url: str, prefill_tokens: int, prefill_done: bool) -> None:
        self._add(url, requests=-1, prefill_tokens=0 if prefill_done else -prefill_tokens)

    def own(self) -> dict[str, EndpointLoad]:
        """This replica's own counts on every endpoint it has counted: what it publishes."""
        return dict(self._own)

    def set_peers(self, loads: Mapping[str, EndpointLoad]) -> None:
        """The other replicas' load, summed per endpoint (replaces the previous reading)."""
        self._peers = dict(loads)

    def of(self, url: str) -> EndpointLoad:
        own = self._own.get(url, IDLE)
        peers = self._peers.get(url)
        return own if peers is None else own.plus(peers)

    def peer_prefill_tokens(self, url: str) -> int:
        peers = self._peers.get(url)
        return 0 if peers is None else peers.prefill_tokens

    def _add(self, url: str, *, requests: int, prefill_tokens: int) -> None:
        now = self._own.get(url, IDLE)
        self._own[url] = EndpointLoad(
            in_flight=now.in_flight + requests, prefill_tokens=now.prefill_tokens + prefill_tokens
        )
