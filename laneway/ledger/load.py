"""In-flight load per endpoint: requests sent and not finished, and the prompt tokens sent
whose first token has not come back (what delays the next request's first token there).

This replica's own counts change only through the ledger's request life; other gateway
replicas' counts arrive as data (`set_peer_loads`, from the Redis shell), and a pick sees
the sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from laneway.routing.cycle import EndpointLoad


class LoadBook:
    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}
        self._prefill: dict[str, int] = {}
        self._peers: Mapping[str, EndpointLoad] = {}

    def start(self, url: str, prefill_tokens: int) -> None:
        self._in_flight[url] = self._in_flight.get(url, 0) + 1
        self._prefill[url] = self._prefill.get(url, 0) + prefill_tokens

    def prefill_done(self, url: str, prefill_tokens: int) -> None:
        self._prefill[url] -= prefill_tokens

    def finish(self, url: str, prefill_tokens: int, prefill_done: bool) -> None:
        self._in_flight[url] -= 1
        if not prefill_done:
            self._prefill[url] -= prefill_tokens

    def own(self, urls: Iterable[str] | None = None) -> dict[str, EndpointLoad]:
        """This replica's own counts (what it publishes for its peers); every endpoint it
        has counted when `urls` is None."""
        wanted = self._in_flight.keys() if urls is None else urls
        return {
            url: EndpointLoad(
                in_flight=self._in_flight.get(url, 0), prefill_tokens=self._prefill.get(url, 0)
            )
            for url in wanted
        }

    def set_peers(self, loads: Mapping[str, EndpointLoad]) -> None:
        """The other replicas' load, summed per endpoint (replaces the previous reading)."""
        self._peers = dict(loads)

    def of(self, url: str) -> EndpointLoad:
        own = EndpointLoad(
            in_flight=self._in_flight.get(url, 0), prefill_tokens=self._prefill.get(url, 0)
        )
        peers = self._peers.get(url)
        return own if peers is None else own.plus(peers)
