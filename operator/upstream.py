"""Pure rendering of the Gateway API Inference Extension's InferencePools
(`inference.networking.k8s.io/v1`) that put laneway's pools behind a Gateway.

A Gateway API implementation (Envoy Gateway, Istio, kgateway, GKE, ...) routes an HTTPRoute
to an upstream InferencePool and asks its endpoint picker which pod serves each request. For
laneway's picker (`laneway epp`) to choose the lane before the endpoint, one upstream pool
must hold every engine pod of a public model across laneway's pools: the operator labels
each engine pod `models.laneway.io/<model>: "true"` for every model its pool answers
(`routing.models`, else its served name), and renders per model one upstream pool that
selects that label, names laneway's picker Service in its `endpointPickerRef`, and is owned
by every laneway pool serving the model, so the garbage collector removes it with the last.

The upstream API (api/v1/inferencepool_types.go of kubernetes-sigs/
gateway-api-inference-extension): `selector.matchLabels` (matchLabels only, 1-64 entries),
`targetPorts` (1-8 port numbers, each pod:port an endpoint), `appProtocol`,
`endpointPickerRef` {group "", kind Service, name, port.number (required for a Service),
failureMode FailOpen|FailClose (default FailClose)}. The reference has no namespace: the
picker Service must be in the pool's namespace.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from laneway.api import API_VERSION, KIND, InferencePool
from laneway.kube.client import FIELD_MANAGER, RESOURCE_TYPES, UPSTREAM_POOL, Manifest

MODEL_LABEL_PREFIX = "models.laneway.io/"
MODEL_ANNOTATION = "laneway.io/model"  # the model's own name, which the object's name slugs
PICKER_PORT = 9002  # the Endpoint Picker Protocol's gRPC port
MAX_TARGET_PORTS = 8  # the upstream schema's bound
_NAME_LIMIT = 63  # a label's name part
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class FailureMode(StrEnum):
    FAIL_OPEN = "FailOpen"  # the proxy picks an endpoint itself while the picker is away
    FAIL_CLOSE = "FailClose"  # the proxy refuses requests while the picker is away


@dataclass(frozen=True)
class PickerRef:
    """laneway's endpoint picker as the upstream pools reference it: a Service of this
    name in each pool's namespace, on the protocol's gRPC port."""

    service: str
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    port: int = PICKER_PORT


def model_slug(model: str) -> str:
    """A name for `model` that is both an object's name and a label's name part: itself
    when it can be, else a lowercase spelling with a hash of the model, so that two models
    never share one."""
    if len(model) <= _NAME_LIMIT and _SUBDOMAIN.fullmatch(model):
        return model
    digest = hashlib.sha256(model.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[: _NAME_LIMIT - 9].rstrip("-")
    return f"{base}-{digest}" if base else f"model-{digest}"


def model_label(model: str) -> str:
    return MODEL_LABEL_PREFIX + model_slug(model)


def model_labels(pool: InferencePool) -> dict[str, str]:
    """The labels that put a pool's engine pods into its models' upstream pools."""
    return {model_label(model): "true" for model in pool.spec.public_models}


def upstream_pools(pools: Sequence[InferencePool], picker: PickerRef) -> list[Manifest]:
    """One upstream InferencePool per namespace and public model of `pools`, in that order
    (a pool selects pods of its own namespace only)."""
    serving: dict[tuple[str, str], list[InferencePool]] = {}
    for pool in pools:
        for model in pool.spec.public_models:
            serving.setdefault((pool.namespace, model), []).append(pool)
    return [_upstream_pool(model, serving[(ns, model)], picker) for ns, model in sorted(serving)]


def _upstream_pool(model: str, pools: list[InferencePool], picker: PickerRef) -> Manifest:
    ports = sorted({pool.spec.port for pool in pools})[:MAX_TARGET_PORTS]
    owners = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": pool.name,
            "uid": pool.uid,
            # Several owners, none the controller: the pool goes with the last of them.
            "controller": False,
            "blockOwnerDeletion": False,
        }
        for pool in sorted(pools, key=lambda p: p.name)
        if pool.uid
    ]
    metadata: dict[str, Any] = {
        "name": model_slug(model),
        "namespace": pools[0].namespace,
        "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
        "annotations": {MODEL_ANNOTATION: model},
    }
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": RESOURCE_TYPES[UPSTREAM_POOL].api_version,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": {model_label(model): "true"}},
            "targetPorts": [{"number": port} for port in ports],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": picker.service,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode.value,
            },
        },
    }
