"""spec: what an InferencePool declares, field by field, with the CEL rules across fields."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from laneway.api.engine import EngineSpec
from laneway.api.lending import LendingSpec
from laneway.api.names import (
    MAX_CONCURRENT_REQUESTS,
    MAX_PARTIAL_PREFILLS,
    MAX_REPLICAS,
    MAX_TOKENS,
)
from laneway.api.scaling import Autoscaling, AutoscalingSpec
from laneway.api.tokenizer import TokenizerSpec
from laneway.api.wire import Wire, rule, rules


class Lane(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


# A name a client sends or a tenant is known by.
Name = Annotated[str, Field(min_length=1, max_length=256)]


class RoutingSpec(Wire):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "!has(self.maxPromptTokens) || self.minPromptTokens <= self.maxPromptTokens",
                ".minPromptTokens",
                "routing.minPromptTokens must not exceed routing.maxPromptTokens",
            )
        )
    )

    # Empty: servedModelName.
    models: tuple[Name, ...] = Field(
        default_factory=tuple,
        max_length=64,
        description="Public model names clients may ask for that this pool answers; empty "
        "means servedModelName.",
    )
    min_prompt_tokens: int = Field(
        default=0, ge=0, le=MAX_TOKENS, description="Shortest prompt, in tokens, routed here."
    )
    # None: up to the context cap.
    max_prompt_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Longest prompt, in tokens, routed here; defaults to the context cap.",
    )
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="Higher wins when several pools fit a request."
    )
    allow_lane_header: bool = Field(
        default=True,
        description="Whether the x-laneway-lane header may pin a request to this lane.",
    )
    # Empty: every tenant.
    tenants: tuple[Name, ...] = Field(
        default_factory=tuple,
        max_length=256,
        description="Tenants this pool serves; empty means every tenant.",
    )


class PrefillSpec(Wire):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "!self.chunkedPrefill || self.chunkSize <= self.tokenBudget",
                ".chunkSize",
                "prefill.chunkSize must not exceed prefill.tokenBudget: lower chunkSize or "
                "raise tokenBudget",
            )
        )
    )

    chunked_prefill: bool = Field(
        default=True,
        description="Split long prompts into chunks scheduled alongside running decodes, so a "
        "long prefill never stalls streaming.",
    )
    chunk_size: int = Field(
        default=1024,
        ge=16,
        le=MAX_TOKENS,
        description="Most prompt tokens of one request in one step (vLLM "
        "--long-prefill-token-threshold, SGLang --chunked-prefill-size).",
    )
    token_budget: int = Field(
        default=2048,
        ge=16,
        le=MAX_TOKENS,
        description="Most tokens, prefill and decode, in one engine step (vLLM "
        "--max-num-batched-tokens, SGLang --max-prefill-tokens).",
    )
    max_partial_prefills: int = Field(
        default=1,
        ge=1,
        le=MAX_PARTIAL_PREFILLS,
        description="How many prompts may be mid-prefill at once (vLLM only).",
    )


class LimitsSpec(Wire):
    max_context_tokens: int = Field(
        default=8192,
        ge=16,
        le=MAX_TOKENS,
        description="Context cap in tokens, prompt plus completion (vLLM --max-model-len, "
        "SGLang --context-length).",
    )
    max_concurrent_requests: int = Field(
        default=256,
        ge=1,
        le=MAX_CONCURRENT_REQUESTS,
        description="Running sequences per replica (vLLM --max-num-seqs, SGLang "
        "--max-running-requests).",
    )


class SLOSpec(Wire):
    ttft_millis: int = Field(
        default=300, ge=1, le=600_000, description="Time-to-first-token target in milliseconds."
    )
    tbt_millis: int = Field(
        default=30, ge=1, le=60_000, description="Time-between-tokens target in milliseconds."
    )


class SchedulingPolicy(StrEnum):
    """The engine's waiting-queue order (vLLM --scheduling-policy; SGLang priority scheduling)."""

    FCFS = "fcfs"  # arrival order
    PRIORITY = "priority"  # a request's `priority` first (lower is more urgent), then arrival


class SchedulingSpec(Wire):
    policy: SchedulingPolicy = Field(
        default=SchedulingPolicy.FCFS,
        description="fcfs admits in arrival order; priority admits by the request's priority, "
        "lower first, then arrival (vLLM --scheduling-policy priority; SGLang "
        "--enable-priority-scheduling --schedule-low-priority-values-first). Running requests "
        "are served every step either way.",
    )


class Selector(Wire):
    # Schema and check side by side: the message says what to change where the generic
    # one for an empty object would not.
    match_labels: dict[str, str] = Field(
        description="Labels the adopted pods carry.", json_schema_extra={"minProperties": 1}
    )

    @field_validator("match_labels")
    @classmethod
    def _names_a_label(cls, labels: dict[str, str]) -> dict[str, str]:
        if not labels:
            raise PydanticCustomError("no_labels", "must name at least one label to adopt pods")
        return labels


@with_config(ConfigDict(strict=True, extra="forbid"))
class Toleration(TypedDict, total=False):
    """A Kubernetes Toleration, passed through to the engine pods as written."""

    key: Annotated[str, Field(description="Taint key the toleration applies to.")]
    operator: Annotated[Literal["Exists", "Equal"], Field(description="Exists or Equal.")]
    value: Annotated[str, Field(description="Taint value the toleration matches.")]
    effect: Annotated[
        Literal["NoSchedule", "PreferNoSchedule", "NoExecute"],
        Field(description="Taint effect to match; empty matches all."),
    ]
    tolerationSeconds: Annotated[  # the Kubernetes field name
        int,
        Field(
            description="How long a NoExecute taint is tolerated.",
            json_schema_extra={"format": "int64"},
        ),
    ]


class PoolSpec(Wire):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "!self.prefill.chunkedPrefill || "
                "self.prefill.chunkSize <= self.limits.maxContextTokens",
                ".prefill.chunkSize",
                "prefill.chunkSize must not exceed limits.maxContextTokens: a chunk longer "
                "than any prompt never splits one; lower chunkSize",
            ),
            rule(
                "!has(self.routing.maxPromptTokens) || "
                "self.routing.maxPromptTokens <= self.limits.maxContextTokens",
                ".routing.maxPromptTokens",
                "routing.maxPromptTokens must not exceed limits.maxContextTokens: lower "
                "maxPromptTokens or raise maxContextTokens",
            ),
            rule(
                "has(self.routing.maxPromptTokens) || "
                "self.routing.minPromptTokens < self.limits.maxContextTokens",
                ".routing.minPromptTokens",
                "routing.minPromptTokens must be below limits.maxContextTokens, or no prompt "
                "could be routed here",
            ),
            rule(
                "self.engine.kind != 'vllm' || "
                "self.prefill.tokenBudget >= self.limits.maxConcurrentRequests",
                ".prefill.tokenBudget",
                "vLLM needs prefill.tokenBudget >= limits.maxConcurrentRequests (one token per "
                "running sequence per step): raise tokenBudget or lower maxConcurrentRequests",
            ),
            rule(
                "self.engine.kind != 'vllm' || self.prefill.chunkedPrefill || "
                "self.prefill.tokenBudget >= self.limits.maxContextTokens",
                ".prefill.tokenBudget",
                "vLLM without chunked prefill needs prefill.tokenBudget >= "
                "limits.maxContextTokens: raise tokenBudget or set prefill.chunkedPrefill: true",
            ),
            rule(
                "self.engine.kind != 'vllm' || self.prefill.maxPartialPrefills == 1",
                ".prefill.maxPartialPrefills",
                "vLLM's V1 engine does not support concurrent partial prefills: set "
                "prefill.maxPartialPrefills to 1",
            ),
            rule(
                "self.engine.kind != 'sglang' || self.prefill.maxPartialPrefills == 1",
                ".prefill.maxPartialPrefills",
                "SGLang prefills one chunked prompt at a time: set prefill.maxPartialPrefills to 1",
            ),
            rule(
                "!has(self.autoscaling) || self.lane == 'batch' || "
                "self.autoscaling.minReplicas >= 1",
                ".autoscaling.minReplicas",
                "autoscaling.minReplicas must be at least 1 for an interactive pool: a chat "
                "request cannot wait for a replica's cold start within its TTFT target",
            ),
            rule(
                "!has(self.lending) || self.lane == 'interactive'",
                ".lending",
                "lending is for an interactive pool, which lends its idle replicas to a batch "
                "pool: remove lending, or set it on the interactive pool",
            ),
            rule(
                "!has(self.lending) || !has(self.autoscaling) || "
                "self.lending.keepReplicas <= self.autoscaling.maxReplicas",
                ".lending.keepReplicas",
                "lending.keepReplicas must not exceed autoscaling.maxReplicas: lower "
                "keepReplicas or raise maxReplicas",
            ),
            rule(
                "!(has(self.selector) && has(self.autoscaling))",
                ".autoscaling",
                "autoscaling cannot be set with selector; adopted pods are not scaled",
            ),
            rule(
                "!(has(self.selector) && has(self.engine.kvEvents))",
                ".engine.kvEvents",
                "engine.kvEvents cannot be set with selector: the operator renders no engine "
                "pods for adopted ones; give those pods --kv-events-config themselves",
            ),
        )
    )

    lane: Lane = Field(
        description="Traffic class: interactive (short prompts, tight TTFT/TBT targets) or "
        "batch (long documents, throughput)."
    )
    model: str = Field(
        min_length=1,
        max_length=512,
        description="Model the engine loads, a model id or a path inside the pod.",
    )
    served_model_name: str = Field(
        default_factory=lambda fields: str(fields.get("model", "")),
        min_length=1,
        max_length=256,
        description="Name the engine serves the model under (the gateway rewrites requests to "
        "it). Defaults to model.",
    )
    engine: EngineSpec = Field(description="Which inference engine runs in the pods, and how.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Engine replicas. With autoscaling the operator sets it through the scale "
        "subresource; `kubectl scale` or an HPA targeting the pool set it the same way.",
    )
    # As written; `autoscaling` is the policy with the lane's defaults filled in.
    scaling: Autoscaling | None = Field(
        default=None,
        alias="autoscaling",
        description="The operator scales the pool on the demand the gateway replicas report "
        "(queued and in-flight work, SLO attainment), through the scale subresource: no "
        "metrics adapter or KEDA needed. Replicas move when every recommendation over a "
        "stabilisation window agrees.",
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="Port the engine serves HTTP on (the Service's port named http).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the engine pods must be scheduled on."
    )
    tolerations: tuple[Toleration, ...] = Field(
        default_factory=tuple,
        max_length=32,
        description="Tolerations of the engine pods (Kubernetes Toleration).",
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="Affinity of the engine pods (Kubernetes Affinity)."
    )
    # As written; `selector` is its matchLabels.
    adopt: Selector | None = Field(
        default=None,
        alias="selector",
        description="Adopt existing engine pods with these labels instead of creating a "
        "Deployment; the operator then manages only the Service and the PodDisruptionBudget.",
    )
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec,
        description="Which requests the gateway sends to this pool.",
        json_schema_extra={"default": {}},
    )
    prefill: PrefillSpec = Field(
        default_factory=PrefillSpec,
        description="How the engine schedules prompt prefill against decodes.",
        # Spelled out, not {}: the API server checks a default against the CEL rules beside
        # it as written, without filling in the nested defaults.
        json_schema_extra={"default": PrefillSpec().model_dump(by_alias=True)},
    )
    limits: LimitsSpec = Field(
        default_factory=LimitsSpec,
        description="Per-replica capacity limits.",
        json_schema_extra={"default": {}},
    )
    slo: SLOSpec = Field(
        default_factory=SLOSpec,
        description="Latency targets the gateway's picking and admission use.",
        json_schema_extra={"default": {}},
    )
    # None: the gateway's default tokenizer.
    tokenizer: TokenizerSpec | None = Field(
        default=None,
        description="How the gateway counts this pool's prompts for routing; absent, the "
        "gateway's default (tiktoken cl100k_base). Name the engine's own tokenizer so that "
        "lane thresholds and context caps hold as the engine counts.",
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="How the engine orders the requests waiting to start.",
        json_schema_extra={"default": {}},
    )

    lending: LendingSpec | None = Field(
        default=None,
        description="Lend whole idle replicas of this interactive pool to a batch pool, and "
        "take them back (ending the batch request there, which is re-queued) when chat needs "
        "them. Absent: the pool serves its own lane only. The request ledger decides the "
        "roles (serving, draining, lent, reclaiming); the gateway and the virtual runner "
        "(laneway bench day) act on them. One gateway replica decides them, the one "
        "holding the lending lease in a shared Redis; the other gateway replicas and the "
        "endpoint picker adopt the roles it publishes.",
    )

    @functools.cached_property  # read by every request's routing
    def public_models(self) -> tuple[str, ...]:
        return self.routing.models or (self.served_model_name,)

    @property
    def max_prompt_tokens(self) -> int:
        cap = self.routing.max_prompt_tokens
        return self.limits.max_context_tokens if cap is None else cap

    @functools.cached_property
    def autoscaling(self) -> AutoscalingSpec | None:
        return None if self.scaling is None else self.scaling.policy(self.lane is Lane.BATCH)

    @functools.cached_property
    def selector(self) -> Mapping[str, str] | None:
        """matchLabels of the engine pods to adopt; None: the operator creates them."""
        return None if self.adopt is None else self.adopt.match_labels
