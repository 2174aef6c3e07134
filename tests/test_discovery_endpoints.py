"""Ready endpoints from EndpointSlices, as the operator's status and the gateway read them."""

from __future__ import annotations

from typing import Any

import pytest

from laneway.kube.endpoints import ready_endpoint_urls, slices_of_service


def endpoint_slice(
    endpoints: list[dict[str, Any]],
    address_type: str = "IPv4",
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": "pool"}},
        "addressType": address_type,
        "ports": [{"name": "http", "port": 8000}] if ports is None else ports,
        "endpoints": endpoints,
    }


def ip(address: str, **conditions: bool) -> dict[str, Any]:
    return {"addresses": [address], "conditions": conditions}


# (case, slices, expected URLs)
TABLE: list[tuple[str, list[dict[str, Any]], tuple[str, ...]]] = [
    ("ready", [endpoint_slice([ip("10.0.0.2", ready=True)])], ("http://10.0.0.2:8000",)),
    ("not ready", [endpoint_slice([ip("10.0.0.2", ready=False)])], ()),
    ("ready unknown means ready", [endpoint_slice([ip("10.0.0.2")])], ("http://10.0.0.2:8000",)),
    (
        "terminating",
        [endpoint_slice([ip("10.0.0.2", ready=True, terminating=True)])],
        (),
    ),
    (
        "IPv6 in brackets",
        [endpoint_slice([ip("fd00::5", ready=True)], address_type="IPv6")],
        ("http://[fd00::5]:8000",),
    ),
    ("FQDN skipped", [endpoint_slice([ip("db.example", ready=True)], address_type="FQDN")], ()),
    (
        "only the port named http",
        [endpoint_slice([ip("10.0.0.2")], ports=[{"name": "metrics", "port": 9090}])],
        (),
    ),
    (
        "sorted and deduplicated across slices",
        [
            endpoint_slice([ip("10.0.0.9"), ip("10.0.0.2")]),
            endpoint_slice([ip("10.0.0.2")]),
        ],
        ("http://10.0.0.2:8000", "http://10.0.0.9:8000"),
    ),
    ("no addresses", [endpoint_slice([{"conditions": {"ready": True}}])], ()),
]


@pytest.mark.parametrize(("case", "slices", "urls"), TABLE, ids=[t[0] for t in TABLE])
def test_ready_endpoint_urls(
    case: str, slices: list[dict[str, Any]], urls: tuple[str, ...]
) -> None:
    assert ready_endpoint_urls(slices) == urls, case


def test_slices_are_matched_by_namespace_and_service_name() -> None:
    mine = endpoint_slice([ip("10.0.0.2")])
    other_service = endpoint_slice([ip("10.0.0.3")])
    other_service["metadata"]["labels"]["kubernetes.io/service-name"] = "other"
    other_namespace = endpoint_slice([ip("10.0.0.4")])
    other_namespace["metadata"]["namespace"] = "elsewhere"
    found = slices_of_service([mine, other_service, other_namespace], "ns", "pool")
    assert found == [mine]
