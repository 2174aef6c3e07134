"""A scripted Kubernetes API server over real HTTP on loopback, for the watch client.

The real one (support/kube/cluster.py) shows what the gateway's discovery does in a cluster;
this one makes the rare moments of a watch happen on cue: list (with resourceVersion), watch
streams of newline-delimited JSON events, 410 Gone for a resourceVersion older than the
compacted history (as a status and as an ERROR event), connections that drop, and canned
answers for the client's single requests. Every request is recorded so tests can check what
the client asked for.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

Manifest = dict[str, Any]

GONE = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: str


class _Drop:
    """Close the connection in the middle of the stream."""


class _Expire:
    """Send an ERROR event with code 410, as the API server does when history is gone."""


class FakeApiServer:
    def __init__(self) -> None:
        self.collections: dict[str, dict[str, Manifest]] = defaultdict(dict)  # path -> objs
        self.requests: list[Request] = []
        self.revision = 1
        self.oldest_revision = 1  # watches from before this get 410 Gone
        self.responses: dict[tuple[str, str], tuple[int, Manifest]] = {}  # canned answers
        self._watchers: dict[str, list[asyncio.Queue[Any]]] = defaultdict(list)
        self._watch_started = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, token: str) -> None:
        """A kubeconfig whose one context is this server, authenticating with `token`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
        path.write_text(yaml.safe_dump(config))

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if not self.port:
            self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Go away: close every watch and refuse connections until `start`."""
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(_Drop())
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the cluster's state, as tests change it ---

    def put(self, path: str, obj: Manifest, event: str | None = None) -> None:
        """Store an object; with `event` (ADDED, MODIFIED), tell the watchers."""
        self.revision += 1
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        self.collections[path][_name(stored)] = stored
        if event:
            self._notify(path, {"type": event, "object": stored})

    def delete(self, path: str, name: str, notify: bool = True) -> None:
        self.revision += 1
        gone = self.collections[path].pop(name)
        gone["metadata"]["resourceVersion"] = str(self.revision)
        if notify:
            self._notify(path, {"type": "DELETED", "object": gone})

    def bookmark(self, path: str) -> None:
        self.revision += 1
        self._notify(
            path,
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.revision)}}},
        )

    def compact(self) -> None:
        """Forget history: watches resuming from any earlier revision get 410 Gone."""
        self.revision += 1
        self.oldest_revision = self.revision

    def drop_watches(self, path: str) -> None:
        for queue in self._watchers[path]:
            queue.put_nowait(_Drop())

    def expire_watches(self, path: str) -> None:
        for queue in self._watchers[path]:
            queue.put_nowait(_Expire())

    async def until_watched(self, *paths: str) -> None:
        async with self._watch_started:
            await self._watch_started.wait_for(lambda: all(self._watchers[p] for p in paths))

    def _notify(self, path: str, event: Manifest) -> None:
        for queue in self._watchers[path]:
            queue.put_nowait(copy.deepcopy(event))

    def _locate(self, path: str) -> tuple[str, str | None, str | None] | None:
        """(collection, name, subresource) that `path` addresses, if it is served."""
        if path in self.collections:
            return path, None, None
        parent, name = path.rsplit("/", 1)
        if parent in self.collections:
            return parent, name, None
        grandparent, owner = parent.rsplit("/", 1)
        if grandparent in self.collections:
            return grandparent, owner, name
        return None

    # --- HTTP ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.text()
        self.requests.append(
            Request(request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        canned = self.responses.get((request.method, request.path))
        if canned is not None:
            return web.json_response(canned[1], status=canned[0])
        if request.method != "GET":
            # Writes are answered only as a test scripts them (responses): the real API
            # server in support/kube/cluster.py is where writes have their real effects.
            return web.json_response({"kind": "Status", "code": 405}, status=405)
        if request.query.get("watch") == "true":
            return await self._watch(request)
        located = self._locate(request.path)
        if located is not None and located[1] is not None:
            found = self.collections[located[0]].get(located[1])
            if found is not None:
                return web.json_response(found)
        if request.path not in self.collections:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        items = [copy.deepcopy(o) for _, o in sorted(self.collections[request.path].items())]
        return web.json_response(
            {"kind": "List", "metadata": {"resourceVersion": str(self.revision)}, "items": items}
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        if since < self.oldest_revision:
            return web.json_response({**GONE, "message": "too old resource version"}, status=410)
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._watchers[request.path].append(queue)
        async with self._watch_started:
            self._watch_started.notify_all()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Drop):
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if isinstance(item, _Expire):
                    error = {"type": "ERROR", "object": {**GONE, "message": "too old"}}
                    await response.write(json.dumps(error).encode() + b"\n")
                    break
                await response.write(json.dumps(item).encode() + b"\n")
        finally:
            self._watchers[request.path].remove(queue)
        await response.write_eof()
        return response


def _name(obj: Manifest) -> str:
    return str(obj["metadata"]["name"])
