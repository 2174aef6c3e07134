"""`laneway epp --kubernetes --watch-objectives`: the cluster's InferenceObjectives
(`inference.networking.x-k8s.io/v1alpha2`), listed then watched in the namespaces the picker
watches pools in, so a platform team's `kubectl apply` of an objective takes effect without
a restart.

The loop is the pool discovery's (gateway/pools/discovery.py): a watch that expires (410
Gone) lists again; an unreachable API server, or one that does not serve the CRD (404), is
retried with jittered exponential backoff while the objectives last seen stay in force
(none before the first list). An invalid objective is logged once and left out.
"""

from __future__ import annotations

import asyncio
import logging
import random

from laneway.gateway.epp.objectives import NO_OBJECTIVES, Objectives, from_cluster
from laneway.gateway.pools.discovery import Backoff, Sleep
from laneway.kube.client import KubeApi, KubeError, Manifest, WatchExpired

log = logging.getLogger(__name__)

KIND = "InferenceObjective"


class WatchedObjectives:
    """The ObjectivePriorities of the cluster, as last seen; `run` keeps them current."""

    def __init__(
        self,
        namespace: str | None,
        api: KubeApi | None = None,
        *,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
        watch_timeout_seconds: int = 300,
    ) -> None:
        self.namespace = namespace
        self.current: Objectives = NO_OBJECTIVES
        self._api = api
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._watch_timeout = watch_timeout_seconds
        self._seen: dict[str, Manifest] = {}  # namespace/name -> the object
        self._reported: dict[str, str] = {}

    def priority(self, name: str | None) -> int:
        return self.current.priority(name)

    async def run(self) -> None:
        api = self._api or KubeApi.from_environment()
        try:
            await self._follow(api)
        finally:
            if self._api is None:
                await api.close()

    def _publish(self) -> None:
        objectives, rejected = from_cluster(self._seen)
        for key, reason in rejected.items():
            if self._reported.get(key) != reason:
                log.warning("ignoring InferenceObjective %s: %s", key, reason)
        self._reported = rejected
        if objectives != self.current:
            self.current = objectives
            log.info("InferenceObjectives: %s", dict(objectives.priorities))

    async def _follow(self, api: KubeApi) -> None:
        resource_version: str | None = None
        failures = 0
        while True:
            try:
                if resource_version is None:
                    listed = await api.list(KIND, self.namespace)
                    # A fresh list: whatever it lacks was deleted while we were not watching.
                    self._seen = {_key(item): item for item in listed.items}
                    resource_version = listed.resource_version
                    self._publish()
                async for event in api.watch(
                    KIND, self.namespace, resource_version, timeout_seconds=self._watch_timeout
                ):
                    failures = 0
                    obj = event.get("object") or {}
                    resource_version = obj.get("metadata", {}).get(
                        "resourceVersion", resource_version
                    )
                    if event.get("type") == "DELETED":
                        self._seen.pop(_key(obj), None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        self._seen[_key(obj)] = obj
                    else:
                        continue  # BOOKMARK: only the resourceVersion moved
                    self._publish()
                failures = 0
            except WatchExpired:
                log.info("watch of %s expired (410 Gone); listing again", KIND)
                resource_version = None
            except KubeError as error:
                failures += 1
                delay = self._backoff.delay(failures, self._rng)
                log.warning(
                    "Kubernetes API: %s; keeping the last known InferenceObjectives, "
                    "retrying in %.1fs",
                    error,
                    delay,
                )
                await self._sleep(delay)


def _key(obj: Manifest) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
