"""The InferencePool resource as a whole: the document the API server stores (metadata,
spec, status) and `InferencePool`, the parsed pool every consumer reads."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from laneway.api.names import API_VERSION, KIND
from laneway.api.spec import PoolSpec
from laneway.api.wire import Wire

# Written by the API server and the operator: what laneway does not read is left alone.
OBSERVED = ConfigDict(extra="ignore")
INT64: dict[str, JsonValue] = {"format": "int64"}
DATE_TIME: dict[str, JsonValue] = {"format": "date-time"}


class ObjectMeta(Wire):
    model_config = OBSERVED

    name: str = Field(min_length=1)
    namespace: str = Field(default="default", min_length=1)
    generation: int = 0
    uid: str = ""


def _http_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise PydanticCustomError(
            "http_url", "must be an http(s) URL, got {url}", {"url": repr(url)}
        )
    return url


class StatusAutoscaling(Wire):
    model_config = OBSERVED

    desired_replicas: int | None = Field(
        default=None, description="Replicas the last decision asked for."
    )
    recommendation: int | None = Field(
        default=None, description="Replicas this instant's demand asks for, before stabilisation."
    )
    reason: str | None = Field(default=None, description="Why, for a person.")
    last_scale_time: str | None = Field(
        default=None,
        description="When the autoscaler last changed spec.replicas.",
        json_schema_extra=DATE_TIME,
    )


class Condition(Wire):
    model_config = OBSERVED

    type: str = Field(description="Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str | None = Field(default=None, description="One CamelCase word for machines.")
    message: str | None = Field(
        default=None, description="What happened and what to change, for people."
    )
    observed_generation: int | None = Field(
        default=None,
        description="The spec generation the condition was computed from.",
        json_schema_extra=INT64,
    )
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed.", json_schema_extra=DATE_TIME
    )


class PoolStatus(Wire):
    model_config = OBSERVED

    observed_generation: int | None = Field(
        default=None,
        description="The spec generation this status describes.",
        json_schema_extra=INT64,
    )
    replicas: int | None = Field(default=None, description="Engine pods that exist.")
    ready_replicas: int | None = Field(default=None, description="Engine pods ready to serve.")
    ready: str | None = Field(
        default=None, description="Ready replicas / desired replicas, for kubectl get."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the engine pods (for the scale subresource)."
    )
    # Local mode reads a pool's engines from here; in a cluster the operator reports them.
    endpoints: tuple[Annotated[str, AfterValidator(_http_url)], ...] = Field(
        default_factory=tuple, description="Base URLs of the ready engine endpoints."
    )
    slo_attainment: str | None = Field(
        default=None,
        description='Recent share of the pool\'s requests that met spec.slo (e.g. "99.4%"), '
        "as the gateway replicas measured it.",
    )
    autoscaling: StatusAutoscaling | None = Field(
        default=None, description="The autoscaler's last decision and why."
    )
    engine_args: tuple[str, ...] = Field(
        default_factory=tuple,
        description="The engine's full command line, as rendered from the spec.",
    )
    conditions: tuple[Condition, ...] = Field(
        default_factory=tuple,
        description="Ready, Progressing and Degraded, with reasons and messages.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


def _must_be(expected: str, value: str | None) -> str | None:
    if value != expected:
        raise PydanticCustomError(
            "wrong_value",
            "must be {expected}, got {value}",
            {"expected": expected, "value": repr(value)},
        )
    return value


class PoolDocument(Wire):
    """InferencePool declares a pool of LLM inference engine replicas serving one lane
    (interactive or batch). The laneway operator runs them; the laneway gateway routes
    requests to them by prompt length, model and lane."""

    api_version: str | None = Field(
        default=None,
        validate_default=True,
        description=f"API version of this object, {API_VERSION}.",
    )
    kind: str | None = Field(
        default=None, validate_default=True, description=f"Kind of this object, {KIND}."
    )
    # The API server checks metadata itself: the CRD says only that it is an object.
    metadata: Annotated[ObjectMeta, WithJsonSchema({"type": "object"})] = Field(
        default_factory=dict, validate_default=True
    )
    spec: PoolSpec = Field(description="The pool's desired state.")
    status: PoolStatus = Field(
        default_factory=PoolStatus,
        description="What the operator observed; written only by the operator.",
    )

    @field_validator("api_version")
    @classmethod
    def _served_version(cls, value: str | None) -> str | None:
        return _must_be(API_VERSION, value)

    @field_validator("kind")
    @classmethod
    def _our_kind(cls, value: str | None) -> str | None:
        return _must_be(KIND, value)


@dataclass(frozen=True)
class InferencePool:
    name: str
    namespace: str
    spec: PoolSpec
    generation: int = 0
    uid: str = ""
    # Engine base URLs. Local mode reads them from the document's `status.endpoints`
    # (what the operator reports in a cluster); the Kubernetes watcher fills them from
    # the EndpointSlices of the pool's Service.
    endpoints: tuple[str, ...] = ()

    @functools.cached_property  # read several times by every request
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
