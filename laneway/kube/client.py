"""A small asyncio client for the Kubernetes REST API: what the operator and the gateway's
discovery need (get, list, create, server-side apply, delete, status patch, scale, watch)
and no more.

Both run inside asyncio (kopf, aiohttp), so this speaks HTTP with aiohttp instead of the
blocking `kubernetes` client; that package is used only to read the in-cluster service
account or a kubeconfig (including exec credential plugins).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from laneway.api import API_VERSION, KIND, PLURAL

FIELD_MANAGER = "laneway-operator"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    api_version: str
    kind: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{prefix}{where}/{self.plural}" + (f"/{name}" if name else "")


# The Gateway API Inference Extension's InferencePool, which shares laneway's kind name:
# known by its qualified name, as kubectl spells it to tell the two apart.
UPSTREAM_POOL_GROUP = "inference.networking.k8s.io"
UPSTREAM_POOL = f"{KIND}.{UPSTREAM_POOL_GROUP}"
# Its InferenceObjective (a request kind's priority), still in the experimental group.
OBJECTIVE_GROUP = "inference.networking.x-k8s.io"

RESOURCE_TYPES = {
    **{
        rt.kind: rt
        for rt in (
            ResourceType("apps/v1", "Deployment", "deployments"),
            ResourceType("v1", "Service", "services"),
            ResourceType("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
            ResourceType("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
            ResourceType("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
            ResourceType("v1", "Event", "events"),
            ResourceType(API_VERSION, KIND, PLURAL),
            ResourceType(
                f"{OBJECTIVE_GROUP}/v1alpha2", "InferenceObjective", "inferenceobjectives"
            ),
        )
    },
    UPSTREAM_POOL: ResourceType(f"{UPSTREAM_POOL_GROUP}/v1", KIND, "inferencepools"),
}


def type_name(manifest: Mapping[str, Any]) -> str:
    """The RESOURCE_TYPES key of `manifest`: its kind, qualified by its group where two
    groups share the kind."""
    group = str(manifest.get("apiVersion", "")).rpartition("/")[0]
    qualified = f"{manifest['kind']}.{group}"
    return qualified if qualified in RESOURCE_TYPES else str(manifest["kind"])


# asyncio before 3.12.8 (and 3.13.0) leaves a TLS connection's socket open where the loop
# ends during its TLS shutdown, as a cancelled watch's may: aiohttp aborts those transports
# at close when asked (`enable_cleanup_closed`), and warns that the flag is moot elsewhere.
_ABORT_CLOSING_TLS = sys.version_info < (3, 12, 8) or (3, 13, 0) <= sys.version_info < (3, 13, 1)


class KubeError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {message}" if status else message)

    @property
    def transient(self) -> bool:
        """Worth retrying unchanged: conflicts, throttling, server trouble, no connection."""
        return self.status in (0, 409, 429) or self.status >= 500


class ApiUnreachable(KubeError):
    """No answer: connection refused or dropped, or a timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class WatchExpired(KubeError):
    """410 Gone: the resourceVersion is too old to watch from; list again."""

    def __init__(self, message: str) -> None:
        super().__init__(410, message)


@dataclass(frozen=True)
class ListResult:
    items: tuple[Manifest, ...]
    resource_version: str


class KubeApi:
    """Talks to one API server. `authorization` is called per request, so rotated
    service-account tokens and refreshed exec credentials are picked up."""

    def __init__(
        self,
        base_url: str,
        *,
        authorization: Callable[[], str | None] = lambda: None,
        ssl_context: ssl.SSLContext | bool = True,
        request_timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._authorization = authorization
        self._ssl = ssl_context
        self._request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> KubeApi:
        """In-cluster service account when running in a pod, else the kubeconfig."""
        from kubernetes import client, config  # heavy import, only where a cluster is used

        configuration = client.Configuration()
        load_incluster: Callable[..., None] = config.load_incluster_config
        load_kubeconfig: Callable[..., None] = config.load_kube_config
        try:
            load_incluster(client_configuration=configuration)
        except config.ConfigException:
            load_kubeconfig(config_file=kubeconfig, client_configuration=configuration)
        context: ssl.SSLContext | bool = False
        if configuration.verify_ssl:
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)

        def authorization() -> str | None:
            # auth_settings() runs the client's refresh hook (rotated tokens, exec plugins).
            value = configuration.auth_settings().get("BearerToken", {}).get("value")
            return value if isinstance(value, str) and value else None

        return cls(configuration.host, authorization=authorization, ssl_context=context)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Watch lines carry whole objects; the default 64 KiB line limit is too small.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(enable_cleanup_closed=_ABORT_CLOSING_TLS),
                read_bufsize=4 * 1024 * 1024,
            )
        return self._session

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._authorization()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str | None = None,
    ) -> Manifest | None:
        """One request; returns the JSON body, None for 404, raises KubeError otherwise."""
        data = None if body is None else json.dumps(body)
        try:
            async with self._client().request(
                method,
                self.base_url + path,
                params=params,
                data=data,
                headers=self._headers(content_type if data is not None else None),
                ssl=self._ssl,
                timeout=aiohttp.ClientTimeout(total=self._request_timeout),
            ) as response:
                if response.status == 404:
                    return None
                text = await response.text()
                if response.status >= 400:
                    raise KubeError(response.status, _status_message(text))
                decoded: Manifest = json.loads(text) if text else {}
                return decoded
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ApiUnreachable(f"{method} {path}: {error or type(error).__name__}") from error

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        return await self._request("GET", RESOURCE_TYPES[kind].path(namespace, name))

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> ListResult:
        params = {"labelSelector": label_selector} if label_selector else None
        found = await self._request("GET", RESOURCE_TYPES[kind].path(namespace), params=params)
        if found is None:
            raise KubeError(404, f"{kind} is not served by this cluster (is the CRD installed?)")
        items = tuple(found.get("items") or ())
        return ListResult(items, str(found.get("metadata", {}).get("resourceVersion", "")))

    async def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply with force: this operator owns every field it renders."""
        metadata = manifest["metadata"]
        path = RESOURCE_TYPES[type_name(manifest)].path(metadata["namespace"], metadata["name"])
        applied = await self._request(
            "PATCH",
            path,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=manifest,
            content_type="application/apply-patch+yaml",
        )
        if applied is None:
            raise KubeError(404, f"{path} vanished while being applied")
        return applied

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        await self._request(
            "DELETE",
            RESOURCE_TYPES[kind].path(namespace, name),
            body={"propagationPolicy": "Background"},
            content_type="application/json",
        )

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        await self._request(
            "PATCH",
            RESOURCE_TYPES[kind].path(namespace, name) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        """Set spec.replicas through the scale subresource, the way `kubectl scale` does."""
        await self._request(
            "PATCH",
            RESOURCE_TYPES[kind].path(namespace, name) + "/scale",
            body={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
        )

    async def create_object(self, manifest: Manifest) -> Manifest:
        """POST a new object (e.g. an Event with a generateName)."""
        namespace = manifest["metadata"]["namespace"]
        created = await self._request(
            "POST",
            RESOURCE_TYPES[type_name(manifest)].path(namespace),
            body=manifest,
            content_type="application/json",
        )
        if created is None:
            raise KubeError(404, f"{manifest['kind']} in {namespace}: the namespace is gone")
        return created

    async def watch(
        self,
        kind: str,
        namespace: str | None,
        resource_version: str,
        *,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[Manifest]:
        """Watch events after `resource_version` until the server ends the watch.

        Raises WatchExpired on 410 Gone (answered as a status or as an ERROR event) and
        ApiUnreachable when the connection drops."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        path = RESOURCE_TYPES[kind].path(namespace)
        try:
            async with self._client().get(
                self.base_url + path,
                params=params,
                headers=self._headers(),
                ssl=self._ssl,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._request_timeout, sock_read=timeout_seconds + 30
                ),
            ) as response:
                if response.status == 410:
                    raise WatchExpired(_status_message(await response.text()))
                if response.status >= 400:
                    raise KubeError(response.status, _status_message(await response.text()))
                async for line in response.content:
                    if not line.strip():
                        continue
                    event: Manifest = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        message = str(status.get("message", "watch error"))
                        if status.get("code") == 410:
                            raise WatchExpired(message)
                        raise KubeError(int(status.get("code") or 500), message)
                    yield event
        except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError) as error:
            raise ApiUnreachable(f"watch {path}: {error or type(error).__name__}") from error
        except json.JSONDecodeError as error:
            raise ApiUnreachable(f"watch {path}: truncated event ({error})") from error


def _status_message(text: str) -> str:
    """The `message` of a Kubernetes Status body, or the body itself."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "no details"
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return text.strip()[:500]
