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

import logging

from laneway.gateway.epp.objectives import NO_OBJECTIVES, Objectives, from_cluster
from laneway.gateway.pools.discovery import Retry, follow
from laneway.kube.client import KubeApi, Manifest

log = logging.getLogger(__name__)

KIND = "InferenceObjective"


class WatchedObjectives:
    """The ObjectivePriorities of the cluster, as last seen; `run` keeps them current."""

    def __init__(
        self,
        namespace: str | None,
        api: KubeApi | None = None,
        *,
        retry: Retry | None = None,
    ) -> None:
        self.namespace = namespace
        self.current: Objectives = NO_OBJECTIVES
        self._api = api
        self._retry = retry or Retry()
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
        def listed(items: tuple[Manifest, ...]) -> None:
            # A fresh list: whatever it lacks was deleted while we were not watching.
            self._seen = {_key(item): item for item in items}
            self._publish()

        def changed(event: Manifest) -> None:
            obj = event.get("object") or {}
            if event.get("type") == "DELETED":
                self._seen.pop(_key(obj), None)
            elif event.get("type") in ("ADDED", "MODIFIED"):
                self._seen[_key(obj)] = obj
            else:
                return
            self._publish()

        await follow(
            api,
            KIND,
            self.namespace,
            listed=listed,
            changed=changed,
            retry=self._retry,
            keeping="InferenceObjectives",
        )


def _key(obj: Manifest) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
