"""A scripted Kubernetes API server over real HTTP on loopback, for the watch client and
for running kopf itself.

No kube-apiserver can run on these machines. This one serves what `KubeApi` and kopf
speak: discovery documents, list (with resourceVersion), watch streams of newline-delimited
JSON events, 410 Gone for a resourceVersion older than the compacted history, connections
that drop, merge patches (status subresource included), server-side apply as
create-or-merge, creates, and deletes with garbage collection by owner reference. Every
request is recorded so tests can check what the client asked for.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import defaultdict
from collections.abc import Callable, Collection
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
        self._changed = asyncio.Condition()  # notified on every write
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

    def watching(self, path: str) -> int:
        return len(self._watchers[path])

    async def until_watched(self, *paths: str) -> None:
        async with self._watch_started:
            await self._watch_started.wait_for(lambda: all(self._watchers[p] for p in paths))

    def _notify(self, path: str, event: Manifest) -> None:
        for queue in self._watchers[path]:
            queue.put_nowait(copy.deepcopy(event))

    def serve_discovery(
        self, resources: list[tuple[str, str, str, str]], cluster_scoped: Collection[str] = ()
    ) -> None:
        """Discovery documents for (group, version, kind, plural) resources, each with a
        status subresource, plus an empty collection per resource: in namespace `serving`,
        or cluster-wide for the plurals in `cluster_scoped`."""
        by_group_version: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for group, version, kind, plural in resources:
            by_group_version[(group, version)] += [
                {
                    "name": plural,
                    "singularName": kind.lower(),
                    "namespaced": plural not in cluster_scoped,
                    "kind": kind,
                    "verbs": ["get", "list", "watch", "create", "patch", "delete"],
                },
                {"name": f"{plural}/status", "singularName": "", "namespaced": True, "kind": kind},
            ]
            prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
            where = "" if plural in cluster_scoped else "/namespaces/serving"
            self.collections.setdefault(f"{prefix}{where}/{plural}", {})
        self.responses[("GET", "/version")] = (200, {"major": "1", "minor": "37"})
        self.responses[("GET", "/api")] = (200, {"versions": ["v1"]})
        groups = []
        for (group, version), listed in by_group_version.items():
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            self.responses[("GET", path)] = (200, {"groupVersion": version, "resources": listed})
            if group:
                entry = {"groupVersion": f"{group}/{version}", "version": version}
                groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
        self.responses[("GET", "/apis")] = (200, {"groups": groups})

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait until `check()` holds; it is tried after every write."""
        async with self._changed:
            await self._changed.wait_for(check)

    def find(self, collection: str, name: str) -> Manifest | None:
        found = self.collections[collection].get(name)
        return copy.deepcopy(found) if found is not None else None

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

    async def _write(self, request: web.Request, body: str) -> web.StreamResponse:
        located = self._locate(request.path)
        if located is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        collection, name, subresource = located
        document: Any = json.loads(body) if body else {}
        if request.method == "POST" and name is None:
            self.revision += 1
            metadata = document.setdefault("metadata", {})
            metadata.setdefault("name", f"{metadata.get('generateName', 'x-')}{self.revision}")
            metadata["resourceVersion"] = str(self.revision)
            self.collections[collection][_name(document)] = document
            await self._wrote()
            return web.json_response(document, status=201)
        assert name is not None
        live = self.collections[collection].get(name)
        if request.method == "DELETE":
            if live is None:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            self._collect(collection, name)
            await self._wrote()
            return web.json_response({"kind": "Status", "status": "Success"})
        created = live is None
        if live is None:
            if request.content_type != "application/apply-patch+yaml":
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            self.revision += 1
            live = {"metadata": {"uid": f"uid-{self.revision}", "generation": 1}}
        before = copy.deepcopy(live.get("spec"))
        if request.content_type == "application/json-patch+json":
            _json_patch(live, document)
        else:
            if subresource == "status":
                document = {"status": document.get("status")}
            _merge_patch(live, document)
        if not created and live.get("spec") != before:
            live["metadata"]["generation"] = live["metadata"].get("generation", 1) + 1
        self.put(collection, live, "ADDED" if created else "MODIFIED")
        await self._wrote()
        return web.json_response(self.collections[collection][name])

    def _collect(self, collection: str, name: str) -> None:
        """Delete, then garbage-collect whatever the object owned."""
        self.revision += 1
        gone = self.collections[collection].pop(name)
        gone["metadata"]["resourceVersion"] = str(self.revision)
        self._notify(collection, {"type": "DELETED", "object": gone})
        for other, objects in self.collections.items():
            for child, obj in list(objects.items()):
                owners = obj.get("metadata", {}).get("ownerReferences") or ()
                if any(ref.get("uid") == gone["metadata"].get("uid") for ref in owners):
                    self._collect(other, child)

    async def _wrote(self) -> None:
        async with self._changed:
            self._changed.notify_all()

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
            return await self._write(request, body)
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


def _merge_patch(target: Manifest, patch: Manifest) -> None:
    """RFC 7386 JSON merge patch, which server-side apply approximates here too."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _json_patch(target: Manifest, operations: list[Manifest]) -> None:
    """RFC 6902 JSON patch: the add, replace, remove and test operations kopf sends."""
    for operation in operations:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"][1:].split("/")
        ]
        node: Any = target
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        key: Any = int(last) if isinstance(node, list) and last != "-" else last
        if operation["op"] == "remove":
            del node[key]
        elif operation["op"] == "test":
            continue
        elif isinstance(node, list) and (key == "-" or operation["op"] == "add"):
            node.insert(len(node) if key == "-" else key, operation["value"])
        else:
            node[key] = operation["value"]


def _name(obj: Manifest) -> str:
    return str(obj["metadata"]["name"])
