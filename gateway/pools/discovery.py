"""The gateway's Kubernetes PoolSource: InferencePools and the EndpointSlices of their
Services, watched, turned into the same `InferencePool` model the YAML config feeds.

Two list-then-watch loops (pools, endpoint slices) keep one `ClusterView`; after each
change the complete pool set goes to `update` if it differs from the last one sent. A watch
that expires (410 Gone) lists again; a dropped connection or an unreachable API server is
retried with jittered exponential backoff, and meanwhile nothing is sent, so the gateway
keeps routing on the last pools it knew.

    source = KubernetesPoolSource(namespace="serving")   # None: every namespace
    await source.run(update)  # called with the complete pool set after each change
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.api import KIND, POOL_LABEL, InferencePool, SpecError, parse_pool
from laneway.gateway.pools.sources import PoolUpdate
from laneway.kube.client import KubeApi, KubeError, Manifest, WatchExpired
from laneway.kube.endpoints import ready_endpoint_urls, slices_of_service

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Backoff:
    """Delays between retries: doubling from `initial` up to `maximum`, with full jitter
    in the upper half so many gateways do not retry in step."""

    initial: float = 0.5
    maximum: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** max(attempt - 1, 0))
        return ceiling / 2 + rng.random() * ceiling / 2


@dataclass(frozen=True)
class Retry:
    """How a list-then-watch loop waits: between failed tries, and for the server to end a
    watch."""

    backoff: Backoff = Backoff()
    rng: random.Random = field(default_factory=random.Random)
    sleep: Sleep = asyncio.sleep
    watch_timeout_seconds: int = 300


async def follow(
    api: KubeApi,
    kind: str,
    namespace: str | None,
    *,
    listed: Callable[[tuple[Manifest, ...]], None],
    changed: Callable[[Manifest], None],
    retry: Retry,
    keeping: str,
    label_selector: str | None = None,
) -> None:
    """List `kind`, then watch it from that list's version, for ever: `listed` gets each
    fresh list, `changed` each event but bookmarks. A watch that expires (410 Gone) lists
    again; an API error is retried after a backoff, the last known `keeping` kept meanwhile."""
    resource_version: str | None = None
    failures = 0
    while True:
        try:
            if resource_version is None:
                found = await api.list(kind, namespace, label_selector)
                resource_version = found.resource_version
                listed(found.items)
            async for event in api.watch(
                kind,
                namespace,
                resource_version,
                label_selector=label_selector,
                timeout_seconds=retry.watch_timeout_seconds,
            ):
                failures = 0
                obj = event.get("object") or {}
                resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                if event.get("type") != "BOOKMARK":
                    changed(event)
            failures = 0  # the server ended the watch on time; carry on from here
        except WatchExpired:
            log.info("watch of %s expired (410 Gone); listing again", kind)
            resource_version = None
        except KubeError as error:
            failures += 1
            delay = retry.backoff.delay(failures, retry.rng)
            log.warning(
                "Kubernetes API: %s; keeping the last known %s, retrying %s in %.1fs",
                error,
                keeping,
                kind,
                delay,
            )
            await retry.sleep(delay)


def _key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata", {})
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


@dataclass
class ClusterView:
    """What the watches have seen, by namespace/name; `pools()` is pure over it."""

    pools: dict[str, Manifest] = field(default_factory=dict)
    slices: dict[str, Manifest] = field(default_factory=dict)

    def table(self, kind: str) -> dict[str, Manifest]:
        return self.pools if kind == KIND else self.slices

    def replace(self, kind: str, items: tuple[Manifest, ...]) -> None:
        """A fresh list: whatever it lacks was deleted while we were not watching."""
        table = self.table(kind)
        table.clear()
        table.update({_key(item): item for item in items})

    def apply(self, kind: str, event: Mapping[str, Any]) -> None:
        obj = event.get("object") or {}
        if event.get("type") == "DELETED":
            self.table(kind).pop(_key(obj), None)
        elif event.get("type") in ("ADDED", "MODIFIED"):
            self.table(kind)[_key(obj)] = obj

    def resolve(self) -> tuple[tuple[InferencePool, ...], dict[str, str]]:
        """The valid pools with endpoints from their Service's slices, and the invalid
        ones by key with the reason."""
        pools: list[InferencePool] = []
        rejected: dict[str, str] = {}
        slices = list(self.slices.values())
        for key in sorted(self.pools):
            try:
                pool = parse_pool(self.pools[key])
            except SpecError as error:
                rejected[key] = str(error)
                continue
            mine = slices_of_service(slices, pool.namespace, pool.name)
            pools.append(dataclasses.replace(pool, endpoints=ready_endpoint_urls(mine)))
        return tuple(pools), rejected


@dataclass(frozen=True)
class _Watched:
    kind: str
    label_selector: str | None


# Only the engine Services' slices: the operator labels each Service with its pool, and the
# EndpointSlice controller copies a Service's labels onto its slices.
_WATCHES = (_Watched(KIND, None), _Watched("EndpointSlice", POOL_LABEL))


class KubernetesPoolSource:
    """PoolSource over the Kubernetes API (in-cluster service account or kubeconfig)."""

    def __init__(
        self,
        namespace: str | None,
        api: KubeApi | None = None,
        *,
        retry: Retry | None = None,
    ) -> None:
        self.namespace = namespace
        self._api = api
        self._retry = retry or Retry()
        self._view = ClusterView()
        self._sent: tuple[InferencePool, ...] | None = None
        self._listed: set[str] = set()  # kinds listed at least once
        self._reported: dict[str, str] = {}

    async def run(self, update: PoolUpdate) -> None:
        api = self._api or KubeApi.from_environment()
        try:
            async with asyncio.TaskGroup() as group:
                for watched in _WATCHES:
                    group.create_task(self._follow(api, watched, update))
        finally:
            if self._api is None:
                await api.close()

    def _publish(self, update: PoolUpdate) -> None:
        if len(self._listed) < len(_WATCHES):
            return  # pools without their endpoints, or endpoints without pools, mean nothing
        pools, rejected = self._view.resolve()
        for key, reason in rejected.items():
            if self._reported.get(key) != reason:
                log.warning("ignoring InferencePool %s: %s", key, reason)
        self._reported = rejected
        if pools != self._sent:
            self._sent = pools
            update(pools)

    async def _follow(self, api: KubeApi, watched: _Watched, update: PoolUpdate) -> None:
        def listed(items: tuple[Manifest, ...]) -> None:
            self._view.replace(watched.kind, items)
            self._listed.add(watched.kind)
            self._publish(update)

        def changed(event: Manifest) -> None:
            self._view.apply(watched.kind, event)
            self._publish(update)

        await follow(
            api,
            watched.kind,
            self.namespace,
            listed=listed,
            changed=changed,
            retry=self._retry,
            keeping="pools",
            label_selector=watched.label_selector,
        )
