"""spec.engine: which inference engine runs in the pods, and how."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from laneway.api.names import (
    DEFAULT_KV_EVENT_BLOCK_SIZE,
    KV_EVENTS_ENDPOINT_PATTERN,
    KV_EVENTS_RENDERED_FLAGS,
    MAX_TIME_SCALE,
    SIMULATOR_KV_BLOCK_SIZE,
    KVBlockSize,
)
from laneway.api.wire import Wire, rule, rules


class EngineKind(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    SIMULATOR = "simulator"


class MetricsFlavor(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class SimulatorSpec(Wire):
    """How a `simulator` engine behaves: which hardware/model it imitates, and how fast."""

    profile: str = Field(
        default="h200-llama3-8b",
        min_length=1,
        max_length=64,
        description="Hardware and model profile the simulator imitates.",
    )
    time_scale: float = Field(
        default=1.0,
        gt=0,
        le=MAX_TIME_SCALE,
        description="Speed-up over real time (10 runs ten times faster).",
    )
    metrics_flavor: MetricsFlavor = Field(
        default=MetricsFlavor.VLLM, description="Metric names served on /metrics."
    )


_ENDPOINT_RULE = f"self.endpoint.matches('{KV_EVENTS_ENDPOINT_PATTERN}')"
_ENDPOINT_WANTED = (
    "must be tcp://HOST:PORT, the gateway's KV events address the engines connect to (e.g. "
    "tcp://laneway-gateway-kv-events.laneway.svc:5557)"
)


class KVEventsSpec(Wire):
    """The engines publish their KV cache events to the gateway (vLLM --kv-events-config)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(_ENDPOINT_RULE, ".endpoint", f"engine.kvEvents.endpoint {_ENDPOINT_WANTED}")
        )
    )

    # The engines connect to it (the gateway's SUB socket binds it).
    endpoint: str = Field(
        min_length=1,
        max_length=259,
        description="tcp://HOST:PORT of the gateway's KV events Service, which the engines "
        "connect to (the chart's <fullname>-gateway-kv-events, e.g. "
        "tcp://laneway-gateway-kv-events.laneway.svc:5557).",
    )
    block_size: KVBlockSize = Field(
        default=DEFAULT_KV_EVENT_BLOCK_SIZE,
        description="Tokens per KV cache block (vLLM --block-size), the blockSize the "
        f"gateway's picking.prefix.kvEvents entry names. {SIMULATOR_KV_BLOCK_SIZE} for the "
        "simulator.",
    )

    @field_validator("endpoint")
    @classmethod
    def _tcp_host_port(cls, endpoint: str) -> str:
        # The CEL rule above, for documents that never meet an API server.
        if not re.fullmatch(KV_EVENTS_ENDPOINT_PATTERN, endpoint):
            raise PydanticCustomError(
                "kv_events_endpoint",
                f"{_ENDPOINT_WANTED}, got {{endpoint}}",
                {"endpoint": repr(endpoint)},
            )
        return endpoint


@with_config(ConfigDict(strict=True, extra="allow"))
class EnvVar(TypedDict):
    """A Kubernetes EnvVar, passed through to the engine container as written."""

    name: Annotated[str, Field(min_length=1, description="Variable name.")]


# A Kubernetes quantity: 1, "500m", "64Gi".
Quantity = int | str


@with_config(ConfigDict(strict=True, extra="forbid"))
class ResourceRequirements(TypedDict, total=False):
    limits: Annotated[
        dict[str, Quantity], Field(description="Most resources the container may use.")
    ]
    requests: Annotated[
        dict[str, Quantity],
        Field(description="Resources the scheduler reserves for the container."),
    ]


def _kv_flags_rule() -> str:
    uses = " || ".join(f"a.startsWith('{flag}')" for flag in KV_EVENTS_RENDERED_FLAGS)
    return f"!has(self.kvEvents) || !has(self.args) || !self.args.exists(a, {uses})"


class EngineSpec(Wire):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "self.kind == 'simulator' || !has(self.simulator)",
                ".simulator",
                "engine.simulator is only for engine kind simulator; remove it",
            ),
            rule(
                "self.kind != 'sglang' || !has(self.kvEvents)",
                ".kvEvents",
                "engine.kvEvents is for engine kind vllm or simulator: SGLang's KV events "
                "(v0.5.4, the operator's default image) do not chain their blocks as the "
                "gateway reads them; remove engine.kvEvents",
            ),
            rule(
                "self.kind != 'simulator' || !has(self.kvEvents) || "
                f"self.kvEvents.blockSize == {SIMULATOR_KV_BLOCK_SIZE}",
                ".kvEvents.blockSize",
                f"engine.kvEvents.blockSize must be {SIMULATOR_KV_BLOCK_SIZE} for engine kind "
                "simulator (its KV blocks)",
            ),
            rule(
                _kv_flags_rule(),
                ".args",
                "engine.args must not carry --kv-events-config or --block-size with "
                "engine.kvEvents, which renders both: remove them from engine.args (the "
                "block size is engine.kvEvents.blockSize)",
            ),
        )
    )

    kind: EngineKind = Field(
        description="vllm or sglang (GPU engines), or simulator (laneway's calibrated engine "
        "simulator, for clusters without GPUs).",
        # A bound on the string CEL compares, for the API server's cost estimate.
        json_schema_extra={"maxLength": 16},
    )
    # None: the renderer's default image for the kind.
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Container image; defaults to the operator's image for the kind.",
    )
    args: tuple[Annotated[str, Field(min_length=1)], ...] = Field(
        default_factory=tuple,
        max_length=128,
        description="Extra engine flags, appended after the flags rendered from this spec "
        "(see status.engineArgs for the full list).",
    )
    env: tuple[EnvVar, ...] = Field(
        default_factory=tuple,
        max_length=128,
        description="Environment variables of the engine container (Kubernetes EnvVar).",
    )
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(),
        description="Compute resources of the engine container (Kubernetes "
        "ResourceRequirements), e.g. limits nvidia.com/gpu.",
    )
    # Only for kind simulator; None: SimulatorSpec().
    simulator: SimulatorSpec | None = Field(
        default=None, description="Settings of a simulator engine."
    )
    # None: the engines publish no KV events.
    kv_events: KVEventsSpec | None = Field(
        default=None,
        description="The engines publish their KV cache events (which prompt blocks their "
        "prefix cache stores and evicts) to the gateway, which then routes on what each "
        "engine really holds: the operator renders vLLM's --kv-events-config with the topic "
        "kv@<pod IP>:<port> and --block-size. The gateway's picking.prefix.kvEvents entry "
        "for this pool must bind the endpoint's port and use the same blockSize.",
    )
