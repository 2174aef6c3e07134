"""Ready engine endpoints from EndpointSlices: the operator reports them in a pool's status
and the gateway's discovery routes to them, so both read them the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PORT_NAME = "http"  # the engine Service's port name (contracts.md)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def slices_of_service(
    slices: Iterable[Mapping[str, Any]], namespace: str, service: str
) -> list[Mapping[str, Any]]:
    return [
        s
        for s in slices
        if s.get("metadata", {}).get("namespace") == namespace
        and s.get("metadata", {}).get("labels", {}).get(SERVICE_NAME_LABEL) == service
    ]


def ready_endpoint_urls(slices: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Sorted base URLs (`http://10.0.0.5:8000`) of the ready, non-terminating endpoints."""
    urls: set[str] = set()
    for endpoint_slice in slices:
        address_type = endpoint_slice.get("addressType")
        if address_type not in ("IPv4", "IPv6"):
            continue  # FQDN slices name hosts outside the cluster network
        port = next(
            (
                p.get("port")
                for p in endpoint_slice.get("ports") or ()
                if p.get("name") == PORT_NAME and isinstance(p.get("port"), int)
            ),
            None,
        )
        if port is None:
            continue
        for endpoint in endpoint_slice.get("endpoints") or ():
            conditions = endpoint.get("conditions") or {}
            # The API says a missing `ready` means ready.
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            addresses = endpoint.get("addresses") or ()
            if not addresses:
                continue
            host = f"[{addresses[0]}]" if address_type == "IPv6" else addresses[0]
            urls.add(f"http://{host}:{port}")
    return tuple(sorted(urls))
