"""A recording stand-in for the Kubernetes API server, for the operator's tests.

Fast and exact about every call, beside tests/test_cluster_operator.py, which runs the
operator against a real API server. `FakeCluster` keeps objects in memory with the
behaviour the operator relies on: server-side apply creates or merges, generation rises
when a spec changes, deleting an owner lets the garbage collector remove what it owns, and
every call is recorded as the RBAC verb and resource it needs.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.api import API_VERSION, KIND
from laneway.kube.client import RESOURCE_TYPES, KubeError, ListResult, Manifest, type_name

Key = tuple[str, str, str]  # kind, namespace, name


@dataclass(frozen=True)
class Call:
    verb: str  # the RBAC verb: get, list, create, patch, delete
    api_group: str
    resource: str


def _group(kind: str) -> str:
    api_version = RESOURCE_TYPES[kind].api_version
    return api_version.split("/")[0] if "/" in api_version else ""


def _merge(live: dict[str, Any], desired: Mapping[str, Any]) -> None:
    for key, value in desired.items():
        if isinstance(value, Mapping) and isinstance(live.get(key), dict):
            _merge(live[key], value)
        else:
            live[key] = copy.deepcopy(value)


def _prune(
    live: dict[str, Any], applied_before: Mapping[str, Any], desired: Mapping[str, Any]
) -> None:
    """Server-side apply drops fields this manager applied before and applies no more."""
    for key, value in applied_before.items():
        if key not in desired:
            live.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(live.get(key), dict):
            _prune(live[key], value, desired[key] if isinstance(desired[key], Mapping) else {})


def _matches(obj: Manifest, selector: str | None) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in (selector or "").split(","):
        if not term:
            continue
        name, _, value = term.partition("=")
        if name not in labels or (value and labels[name] != value):
            return False
    return True


@dataclass
class FakeCluster:
    objects: dict[Key, Manifest] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    failures: list[KubeError] = field(default_factory=list)  # raised by the next calls
    applied: dict[Key, Manifest] = field(default_factory=dict)  # the operator's fields
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _record(self, verb: str, kind: str, subresource: str = "") -> None:
        plural = RESOURCE_TYPES[kind].plural + (f"/{subresource}" if subresource else "")
        self.calls.append(Call(verb, _group(kind), plural))
        if self.failures:
            raise self.failures.pop(0)

    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.verb not in ("get", "list", "watch")]

    # --- what the operator calls ---

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        self._record("get", kind)
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> ListResult:
        self._record("list", kind)
        items = tuple(
            copy.deepcopy(obj)
            for (k, ns, _), obj in sorted(self.objects.items())
            if k == kind and (namespace is None or ns == namespace)
            if _matches(obj, label_selector)
        )
        return ListResult(items, str(next(self._counter)))

    async def apply(self, manifest: Manifest) -> Manifest:
        kind, metadata = type_name(manifest), manifest["metadata"]
        key = (kind, metadata["namespace"], metadata["name"])
        live = self.objects.get(key)
        self._record("patch" if live is not None else "create", kind)
        if live is None:
            live = self._new(manifest)
            self.objects[key] = live
        else:
            before = copy.deepcopy(live.get("spec"))
            _prune(live, self.applied.get(key, {}), manifest)
            _merge(live, manifest)
            if live.get("spec") != before:
                live["metadata"]["generation"] += 1
        live["metadata"]["resourceVersion"] = str(next(self._counter))
        self.applied[key] = copy.deepcopy(manifest)
        return copy.deepcopy(live)

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        self._record("delete", kind)
        self.remove(kind, namespace, name)

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        self._record("patch", kind, "status")
        _merge(self.objects[(kind, namespace, name)].setdefault("status", {}), status)

    async def create_object(self, manifest: Manifest) -> Manifest:
        """`KubeApi.create`: a POST, which takes generateName."""
        self._record("create", type_name(manifest))
        obj = copy.deepcopy(dict(manifest))
        metadata = obj["metadata"]
        metadata.setdefault("name", f"{metadata.get('generateName', 'x-')}{next(self._counter)}")
        self.objects[(type_name(obj), metadata["namespace"], metadata["name"])] = obj
        return copy.deepcopy(obj)

    async def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        self._record("patch", kind, "scale")
        live = self.objects[(kind, namespace, name)]
        if live["spec"].get("replicas") != replicas:
            live["spec"]["replicas"] = replicas
            live["metadata"]["generation"] += 1

    # --- what a test (or another actor in the cluster) does ---

    def _new(self, manifest: Mapping[str, Any]) -> Manifest:
        obj = copy.deepcopy(dict(manifest))
        number = next(self._counter)
        obj["metadata"].update(
            uid=f"uid-{number}",
            generation=1,
            creationTimestamp=f"2026-11-29T09:{number % 60:02d}:00Z",
        )
        return obj

    def create(self, manifest: Mapping[str, Any]) -> Manifest:
        metadata = manifest["metadata"]
        obj = self._new(manifest)
        self.objects[(type_name(manifest), metadata["namespace"], metadata["name"])] = obj
        return copy.deepcopy(obj)

    def pool(self, namespace: str, name: str) -> Manifest:
        return copy.deepcopy(self.objects[(KIND, namespace, name)])

    def edit(
        self, kind: str, namespace: str, name: str, change: Callable[[Manifest], None]
    ) -> None:
        """Someone edits an object in place (kubectl edit, or a controller)."""
        obj = self.objects[(kind, namespace, name)]
        before = copy.deepcopy(obj.get("spec"))
        change(obj)
        if obj.get("spec") != before:
            obj["metadata"]["generation"] += 1

    def remove(self, kind: str, namespace: str, name: str) -> None:
        """Delete, then garbage-collect what the deleted object owned: each object whose
        owners are all gone (one of several owners leaving keeps it)."""
        gone = self.objects.pop((kind, namespace, name), None)
        if gone is None:
            return  # collected already, through another owner
        uid = gone["metadata"].get("uid")
        live = {obj["metadata"].get("uid") for obj in self.objects.values()}
        for key, obj in list(self.objects.items()):
            owners = obj.get("metadata", {}).get("ownerReferences") or ()
            if any(r.get("uid") == uid for r in owners) and not any(
                r.get("uid") in live for r in owners
            ):
                self.remove(*key)


def pool_document(name: str, spec: Mapping[str, Any], namespace: str = "serving") -> Manifest:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": copy.deepcopy(dict(spec)),
    }
