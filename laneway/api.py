"""The InferencePool API (`laneway.io/v1alpha1`): typed model, parsing and validation.

One model for every consumer: the gateway's YAML config, the gateway's Kubernetes watcher,
the operator and `laneway render` all call `parse_pool` and get the same frozen dataclasses,
or a `SpecError` that names every field that is wrong and says what to change.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from laneway.autoscale import ScalePolicy, ScaleSignal

GROUP = "laneway.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
# On every child and engine pod of a pool: the operator selects by it, discovery reads it.
POOL_LABEL = f"{GROUP}/pool"

# Upper bounds shared with the CRD schema, so the apiserver and parse_pool agree.
MAX_TOKENS = 4_194_304  # context, chunk and step-budget sizes
MAX_CONCURRENT_REQUESTS = 65_536
MAX_PARTIAL_PREFILLS = 64
MAX_REPLICAS = 1_000
MAX_TIME_SCALE = 1_000.0


class Lane(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class EngineKind(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    SIMULATOR = "simulator"


@dataclass(frozen=True)
class FieldError:
    path: str  # dotted path from the document root, e.g. "spec.prefill.chunkSize"
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A resource that cannot work; `errors` names each field and what to change."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


class MetricsFlavor(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True)
class SimulatorSpec:
    """How a `simulator` engine behaves: which hardware/model it imitates, and how fast."""

    profile: str = "h200-llama3-8b"
    time_scale: float = 1.0  # 10: ten times faster than real time
    metrics_flavor: MetricsFlavor = MetricsFlavor.VLLM


# The block sizes kvEvents may pin: vLLM's --block-size choices in every release since 0.9
# (vllm/config/cache.py, BlockSize: 1, 8, 16, 32, 64, 128, later 256) that its
# FlashAttention and Triton backends take (multiples of 16).
KV_EVENT_BLOCK_SIZES = (16, 32, 64, 128)
DEFAULT_KV_EVENT_BLOCK_SIZE = 16  # vLLM's default on CUDA, and the gateway's
# `laneway sim` keeps 16-token KV blocks and has no --block-size (simulator/prefix_cache.py).
SIMULATOR_KV_BLOCK_SIZE = 16
# tcp://HOST:PORT, HOST a DNS name (the gateway's KV events Service) or an IPv4 address and
# PORT 1-65535; the CRD's CEL rule holds the same pattern.
KV_EVENTS_ENDPOINT_PATTERN = (
    "^tcp://[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?:"
    "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$"
)
# Flags kvEvents renders, as prefixes of the spellings vLLM's parser takes: `_` for `-`, and
# `--flag=value` or `--kv-events-config.FIELD value` after either.
KV_EVENTS_RENDERED_FLAGS = (
    "--kv-events-config",
    "--kv_events_config",
    "--block-size",
    "--block_size",
)


@dataclass(frozen=True)
class KVEventsSpec:
    """The engines publish their KV cache events to the gateway (vLLM --kv-events-config)."""

    endpoint: str  # tcp://HOST:PORT of the gateway's SUB socket; the engines connect to it
    block_size: int = DEFAULT_KV_EVENT_BLOCK_SIZE  # the engines' --block-size


@dataclass(frozen=True)
class EngineSpec:
    kind: EngineKind
    image: str | None = None  # None: the renderer's default image for the kind
    args: tuple[str, ...] = ()  # extra engine flags, appended after the rendered ones
    env: tuple[Mapping[str, Any], ...] = ()  # Kubernetes EnvVar objects, passed through
    resources: Mapping[str, Any] = field(default_factory=dict)  # Kubernetes ResourceRequirements
    simulator: SimulatorSpec | None = None  # only for kind simulator; None: SimulatorSpec()
    kv_events: KVEventsSpec | None = None  # None: the engines publish no KV events


# One type for the spec and the decision that reads it (`laneway.autoscale.decide`).
AutoscalingSpec = ScalePolicy
# A replica's share of demand when spec.autoscaling.targetPerReplica is left out: four
# 64k-token documents queued or in prefill, or 32 chat requests in flight.
DEFAULT_TARGET_PER_REPLICA = {
    ScaleSignal.PROMPT_TOKENS: 262_144,
    ScaleSignal.IN_FLIGHT_REQUESTS: 32,
}
MAX_WINDOW_SECONDS = 3600


@dataclass(frozen=True)
class RoutingSpec:
    models: tuple[str, ...]  # public model names clients may ask for; empty: servedModelName
    min_prompt_tokens: int = 0
    max_prompt_tokens: int | None = None  # None: up to the context cap
    priority: int = 0  # higher wins when several pools fit a request
    allow_lane_header: bool = True  # may `x-laneway-lane` pin a request to this pool's lane
    tenants: tuple[str, ...] = ()  # empty: every tenant


@dataclass(frozen=True)
class PrefillSpec:
    chunked_prefill: bool = True
    chunk_size: int = 1024  # the most prompt tokens of one request in one step
    token_budget: int = 2048  # the most tokens (prefill + decode) in one engine step
    max_partial_prefills: int = 1  # how many prompts may be mid-prefill at once


@dataclass(frozen=True)
class LimitsSpec:
    max_context_tokens: int = 8192  # prompt + completion
    max_concurrent_requests: int = 256  # running sequences per replica


@dataclass(frozen=True)
class SLOSpec:
    ttft_millis: int = 300
    tbt_millis: int = 30


class TokenizerKind(StrEnum):
    TIKTOKEN = "tiktoken"
    HUGGINGFACE = "huggingface"
    ENGINE = "engine"  # the engine's own /tokenize, asked when the bounds do not decide


# How long the gateway waits for an engine's /tokenize before it counts locally instead.
DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS = 500


@dataclass(frozen=True)
class TokenizerSpec:
    """How the gateway counts this pool's prompts: the engine's own tokenizer, ideally."""

    kind: TokenizerKind
    encoding: str | None = None  # tiktoken
    path: str | None = None  # huggingface: a tokenizer.json, e.g. mounted from a ConfigMap
    # huggingface: a tokenizer_config.json whose chat_template frames chats
    config_path: str | None = None
    timeout_millis: int = DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS  # engine


class SchedulingPolicy(StrEnum):
    """The engine's waiting-queue order (vLLM --scheduling-policy; SGLang priority scheduling)."""

    FCFS = "fcfs"  # arrival order
    PRIORITY = "priority"  # a request's `priority` first (lower is more urgent), then arrival


@dataclass(frozen=True)
class SchedulingSpec:
    policy: SchedulingPolicy = SchedulingPolicy.FCFS


@dataclass(frozen=True)
class PoolSpec:
    lane: Lane
    model: str
    served_model_name: str
    engine: EngineSpec
    replicas: int = 1
    autoscaling: AutoscalingSpec | None = None
    port: int = 8000
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    selector: Mapping[str, str] | None = None  # matchLabels of engine pods to adopt
    routing: RoutingSpec = field(default_factory=lambda: RoutingSpec(models=()))
    prefill: PrefillSpec = field(default_factory=PrefillSpec)
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    slo: SLOSpec = field(default_factory=SLOSpec)
    tokenizer: TokenizerSpec | None = None  # None: the gateway's default tokenizer
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)

    @functools.cached_property  # read by every request's routing
    def public_models(self) -> tuple[str, ...]:
        return self.routing.models or (self.served_model_name,)

    @property
    def max_prompt_tokens(self) -> int:
        cap = self.routing.max_prompt_tokens
        return self.limits.max_context_tokens if cap is None else cap


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


class _Reader:
    """Reads typed fields out of nested mappings, collecting every error with its path."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def mapping(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        fields: Iterable[str] | None = None,
    ) -> Mapping[str, Any]:
        """The object at `key`; with `fields`, any other key in it is reported (a typo
        such as `maxPromtTokens` would otherwise be ignored without a word)."""
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(f"{path}.{key}", f"must be an object, got {_type_name(value)}")
            return {}
        if fields is not None:
            self.known_fields(value, f"{path}.{key}", fields)
        return value

    def known_fields(self, data: Mapping[str, Any], path: str, fields: Iterable[str]) -> None:
        allowed = list(fields)
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"; did you mean {close[0]}?" if close else f"; fields: {', '.join(allowed)}"
                self.fail(f"{path}.{key}", f"is not a field{hint}")

    def string(
        self, data: Mapping[str, Any], key: str, path: str, default: str | None = None
    ) -> str | None:
        value = data.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value.strip():
            self.fail(f"{path}.{key}", f"must be a non-empty string, got {value!r}")
            return default
        return value

    def required_string(self, data: Mapping[str, Any], key: str, path: str) -> str:
        if data.get(key) is None:
            self.fail(f"{path}.{key}", "is required")
            return ""
        return self.string(data, key, path) or ""

    def integer(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        default: int,
        minimum: int = 0,
        maximum: int | None = None,
    ) -> int:
        value = self.optional_integer(data, key, path, minimum, maximum)
        return default if value is None else value

    def optional_integer(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        minimum: int = 0,
        maximum: int | None = None,
    ) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{path}.{key}", f"must be an integer, got {value!r}")
            return None
        if value < minimum:
            self.fail(f"{path}.{key}", f"must be >= {minimum}, got {value}")
            return None
        if maximum is not None and value > maximum:
            self.fail(f"{path}.{key}", f"must be <= {maximum}, got {value}")
            return None
        return value

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        default: float,
        above: float,
        maximum: float,
    ) -> float:
        value = data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(f"{path}.{key}", f"must be a number, got {value!r}")
            return default
        if not above < value <= maximum:
            self.fail(f"{path}.{key}", f"must be above {above} and at most {maximum}, got {value}")
            return default
        return float(value)

    def boolean(self, data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(f"{path}.{key}", f"must be true or false, got {value!r}")
            return default
        return value

    def string_list(self, data: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
        value = data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(f"{path}.{key}", "must be a list of non-empty strings")
            return ()
        return tuple(value)

    def object_list(
        self, data: Mapping[str, Any], key: str, path: str
    ) -> tuple[Mapping[str, Any], ...]:
        value = data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            self.fail(f"{path}.{key}", "must be a list of objects")
            return ()
        return tuple(value)

    def string_map(self, data: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
        value = self.mapping(data, key, path)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            self.fail(f"{path}.{key}", "must map strings to strings")
            return {}
        return dict(value)

    def choice(
        self, data: Mapping[str, Any], key: str, path: str, choices: Iterable[str]
    ) -> str | None:
        options = list(choices)
        value = data.get(key)
        if value is None:
            self.fail(f"{path}.{key}", f"is required, one of {', '.join(options)}")
            return None
        if value not in options:
            self.fail(f"{path}.{key}", f"must be one of {', '.join(options)}, got {value!r}")
            return None
        return str(value)


def _type_name(value: object) -> str:
    return {list: "a list", str: "a string", int: "an integer", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def parse_pool(document: Mapping[str, Any]) -> InferencePool:
    """Parse and validate one InferencePool document; raise SpecError naming every problem."""
    reader = _Reader()
    if document.get("apiVersion") != API_VERSION:
        reader.fail("apiVersion", f"must be {API_VERSION}, got {document.get('apiVersion')!r}")
    if document.get("kind") != KIND:
        reader.fail("kind", f"must be {KIND}, got {document.get('kind')!r}")
    metadata = reader.mapping(document, "metadata", "")
    name = reader.required_string(metadata, "name", "metadata")
    namespace = reader.string(metadata, "namespace", "metadata", "default") or "default"
    generation = metadata.get("generation", 0)
    uid = metadata.get("uid", "")
    spec = _parse_spec(reader, reader.mapping(document, "spec", "", _SPEC_FIELDS))
    status = reader.mapping(document, "status", "")
    endpoints = reader.string_list(status, "endpoints", "status")
    for index, url in enumerate(endpoints):
        if not url.startswith(("http://", "https://")):
            reader.fail(f"status.endpoints[{index}]", f"must be an http(s) URL, got {url!r}")
    reader.errors = [FieldError(e.path.lstrip("."), e.message) for e in reader.errors]
    if reader.errors or spec is None:
        raise SpecError(reader.errors)
    return InferencePool(
        name=name,
        namespace=namespace,
        spec=spec,
        generation=generation if isinstance(generation, int) else 0,
        uid=uid if isinstance(uid, str) else "",
        endpoints=endpoints,
    )


_SPEC_FIELDS = (
    "lane",
    "model",
    "servedModelName",
    "engine",
    "replicas",
    "autoscaling",
    "port",
    "nodeSelector",
    "tolerations",
    "affinity",
    "selector",
    "routing",
    "prefill",
    "limits",
    "slo",
    "tokenizer",
    "scheduling",
)


def _parse_spec(reader: _Reader, spec: Mapping[str, Any]) -> PoolSpec | None:
    path = "spec"
    if not spec:
        reader.fail(path, "is required")
        return None
    lane = reader.choice(spec, "lane", path, [lane.value for lane in Lane])
    model = reader.required_string(spec, "model", path)
    served = reader.string(spec, "servedModelName", path, model) or model
    engine = _parse_engine(reader, spec)
    autoscaling = (
        _parse_autoscaling(reader, spec, lane)
        if "autoscaling" in spec and spec["autoscaling"] is not None
        else None
    )
    routing = _parse_routing(reader, spec)
    prefill = _parse_prefill(reader, spec)
    limits = _parse_limits(reader, spec)
    slo = _parse_slo(reader, spec)
    tokenizer = _parse_tokenizer(reader, spec, path)
    scheduling = _parse_scheduling(reader, spec)
    selector = _parse_selector(reader, spec)
    replicas = reader.integer(spec, "replicas", path, 1, minimum=0, maximum=MAX_REPLICAS)
    port = reader.integer(spec, "port", path, 8000, minimum=1, maximum=65535)
    node_selector = reader.string_map(spec, "nodeSelector", path)
    tolerations = reader.object_list(spec, "tolerations", path)
    affinity = reader.mapping(spec, "affinity", path)
    if lane is None:
        return None
    pool_spec = PoolSpec(
        lane=Lane(lane),
        model=model,
        served_model_name=served,
        engine=engine,
        replicas=replicas,
        autoscaling=autoscaling,
        port=port,
        node_selector=node_selector,
        tolerations=tolerations,
        affinity=affinity,
        selector=selector,
        routing=routing,
        prefill=prefill,
        limits=limits,
        slo=slo,
        tokenizer=tokenizer,
        scheduling=scheduling,
    )
    reader.errors.extend(check_spec(pool_spec))
    return pool_spec


def _parse_engine(reader: _Reader, spec: Mapping[str, Any]) -> EngineSpec:
    path = "spec.engine"
    engine_data = reader.mapping(
        spec,
        "engine",
        "spec",
        ("kind", "image", "args", "env", "resources", "simulator", "kvEvents"),
    )
    engine_kind = reader.choice(engine_data, "kind", path, [k.value for k in EngineKind])
    simulator = _parse_simulator(reader, engine_data) if "simulator" in engine_data else None
    has_kv_events = engine_data.get("kvEvents") is not None
    kv_events = _parse_kv_events(reader, engine_data) if has_kv_events else None
    return EngineSpec(
        kind=EngineKind(engine_kind or EngineKind.SIMULATOR),
        image=reader.string(engine_data, "image", path),
        args=reader.string_list(engine_data, "args", path),
        env=reader.object_list(engine_data, "env", path),
        resources=reader.mapping(engine_data, "resources", path),
        simulator=simulator,
        kv_events=kv_events,
    )


def _parse_kv_events(reader: _Reader, engine_data: Mapping[str, Any]) -> KVEventsSpec | None:
    sub = "spec.engine.kvEvents"
    data = reader.mapping(engine_data, "kvEvents", "spec.engine", ("endpoint", "blockSize"))
    endpoint = reader.required_string(data, "endpoint", sub)
    if endpoint and not re.fullmatch(KV_EVENTS_ENDPOINT_PATTERN, endpoint):
        reader.fail(
            f"{sub}.endpoint",
            f"must be tcp://HOST:PORT, the gateway's KV events address the engines connect "
            f"to (e.g. tcp://laneway-gateway-kv-events.laneway.svc:5557), got {endpoint!r}",
        )
    block_size = reader.integer(data, "blockSize", sub, DEFAULT_KV_EVENT_BLOCK_SIZE, minimum=1)
    if block_size not in KV_EVENT_BLOCK_SIZES:
        reader.fail(
            f"{sub}.blockSize",
            f"must be one of {', '.join(map(str, KV_EVENT_BLOCK_SIZES))}, got {block_size}",
        )
    return KVEventsSpec(endpoint, block_size) if endpoint else None


def _parse_simulator(reader: _Reader, engine_data: Mapping[str, Any]) -> SimulatorSpec:
    sub = "spec.engine.simulator"
    sim_data = reader.mapping(
        engine_data, "simulator", "spec.engine", ("profile", "timeScale", "metricsFlavor")
    )
    flavor = (
        reader.choice(sim_data, "metricsFlavor", sub, [f.value for f in MetricsFlavor])
        if "metricsFlavor" in sim_data
        else None
    )
    return SimulatorSpec(
        profile=reader.string(sim_data, "profile", sub, "h200-llama3-8b") or "h200-llama3-8b",
        time_scale=reader.number(sim_data, "timeScale", sub, 1.0, 0.0, MAX_TIME_SCALE),
        metrics_flavor=MetricsFlavor(flavor or MetricsFlavor.VLLM),
    )


_ROUTING_FIELDS = (
    "models",
    "minPromptTokens",
    "maxPromptTokens",
    "priority",
    "allowLaneHeader",
    "tenants",
)


def _parse_routing(reader: _Reader, spec: Mapping[str, Any]) -> RoutingSpec:
    routing_data = reader.mapping(spec, "routing", "spec", _ROUTING_FIELDS)
    sub = "spec.routing"
    return RoutingSpec(
        models=reader.string_list(routing_data, "models", sub),
        min_prompt_tokens=reader.integer(routing_data, "minPromptTokens", sub, 0, 0, MAX_TOKENS),
        max_prompt_tokens=reader.optional_integer(
            routing_data, "maxPromptTokens", sub, 1, MAX_TOKENS
        ),
        priority=reader.integer(routing_data, "priority", sub, 0, minimum=-1000, maximum=1000),
        allow_lane_header=reader.boolean(routing_data, "allowLaneHeader", sub, True),
        tenants=reader.string_list(routing_data, "tenants", sub),
    )


def _parse_prefill(reader: _Reader, spec: Mapping[str, Any]) -> PrefillSpec:
    prefill_data = reader.mapping(
        spec,
        "prefill",
        "spec",
        ("chunkedPrefill", "chunkSize", "tokenBudget", "maxPartialPrefills"),
    )
    sub = "spec.prefill"
    return PrefillSpec(
        chunked_prefill=reader.boolean(prefill_data, "chunkedPrefill", sub, True),
        chunk_size=reader.integer(prefill_data, "chunkSize", sub, 1024, 16, MAX_TOKENS),
        token_budget=reader.integer(prefill_data, "tokenBudget", sub, 2048, 16, MAX_TOKENS),
        max_partial_prefills=reader.integer(
            prefill_data, "maxPartialPrefills", sub, 1, 1, MAX_PARTIAL_PREFILLS
        ),
    )


def _parse_limits(reader: _Reader, spec: Mapping[str, Any]) -> LimitsSpec:
    limits_data = reader.mapping(
        spec, "limits", "spec", ("maxContextTokens", "maxConcurrentRequests")
    )
    sub = "spec.limits"
    return LimitsSpec(
        max_context_tokens=reader.integer(
            limits_data, "maxContextTokens", sub, 8192, 16, MAX_TOKENS
        ),
        max_concurrent_requests=reader.integer(
            limits_data, "maxConcurrentRequests", sub, 256, 1, MAX_CONCURRENT_REQUESTS
        ),
    )


def _parse_slo(reader: _Reader, spec: Mapping[str, Any]) -> SLOSpec:
    slo_data = reader.mapping(spec, "slo", "spec", ("ttftMillis", "tbtMillis"))
    return SLOSpec(
        ttft_millis=reader.integer(slo_data, "ttftMillis", "spec.slo", 300, 1, 600_000),
        tbt_millis=reader.integer(slo_data, "tbtMillis", "spec.slo", 30, 1, 60_000),
    )


def _parse_scheduling(reader: _Reader, spec: Mapping[str, Any]) -> SchedulingSpec:
    scheduling_data = reader.mapping(spec, "scheduling", "spec", ("policy",))
    policies = [policy.value for policy in SchedulingPolicy]
    policy = (
        reader.choice(scheduling_data, "policy", "spec.scheduling", policies)
        if scheduling_data.get("policy") is not None
        else None
    )
    return SchedulingSpec(SchedulingPolicy(policy or SchedulingPolicy.FCFS))


def _parse_selector(reader: _Reader, spec: Mapping[str, Any]) -> dict[str, str] | None:
    selector_data = reader.mapping(spec, "selector", "spec", ("matchLabels",))
    if not selector_data:
        return None
    selector = reader.string_map(selector_data, "matchLabels", "spec.selector")
    if not selector:
        reader.fail("spec.selector.matchLabels", "must name at least one label to adopt pods")
    return selector


def _parse_tokenizer(reader: _Reader, spec: Mapping[str, Any], path: str) -> TokenizerSpec | None:
    fields = ("kind", "encoding", "path", "configPath", "timeoutMillis")
    data = reader.mapping(spec, "tokenizer", path, fields)
    if not data:
        return None
    sub = f"{path}.tokenizer"
    kind = reader.choice(data, "kind", sub, [kind.value for kind in TokenizerKind])
    encoding = reader.string(data, "encoding", sub, None)
    file = reader.string(data, "path", sub, None)
    config = reader.string(data, "configPath", sub, None)
    timeout = reader.optional_integer(data, "timeoutMillis", sub, minimum=1, maximum=60_000)
    if kind == TokenizerKind.HUGGINGFACE and not file:
        reader.fail(f"{sub}.path", "is required for kind huggingface: a tokenizer.json file")
    # Each field belongs to one kind (the CRD's CEL rules say the same).
    for field_name, value, owner, hint in (
        ("path", file, TokenizerKind.HUGGINGFACE, "a tokenizer.json"),
        ("encoding", encoding, TokenizerKind.TIKTOKEN, "a tiktoken encoding"),
        ("configPath", config, TokenizerKind.HUGGINGFACE, "a tokenizer_config.json"),
        ("timeoutMillis", timeout, TokenizerKind.ENGINE, "the wait for the engine's /tokenize"),
    ):
        if kind is not None and kind != owner and value is not None:
            reader.fail(f"{sub}.{field_name}", f"is for kind {owner.value} ({hint}), not {kind}")
    if kind is None:
        return None
    return TokenizerSpec(
        TokenizerKind(kind),
        encoding,
        file,
        config,
        timeout or DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS,
    )


_AUTOSCALING_FIELDS = (
    "minReplicas",
    "maxReplicas",
    "signal",
    "targetPerReplica",
    "minSloAttainment",
    "scaleUpWindowSeconds",
    "scaleDownWindowSeconds",
)


def _parse_autoscaling(
    reader: _Reader, spec: Mapping[str, Any], lane: str | None
) -> AutoscalingSpec:
    """spec.autoscaling; the signal defaults by lane: prompt tokens for batch (what costs
    GPU time there), requests in flight for interactive."""
    path = "spec.autoscaling"
    data = reader.mapping(spec, "autoscaling", "spec", _AUTOSCALING_FIELDS)
    # A batch pool may sleep at zero: the gateway queues its work and wakes it.
    low = reader.integer(data, "minReplicas", path, 1, minimum=0, maximum=MAX_REPLICAS)
    high = reader.integer(data, "maxReplicas", path, max(low, 1), minimum=1, maximum=MAX_REPLICAS)
    if "maxReplicas" not in data:
        reader.fail(f"{path}.maxReplicas", "is required")
    elif high < low:
        reader.fail(f"{path}.maxReplicas", f"must be >= minReplicas ({low}), got {high}")
    if low == 0 and lane == Lane.INTERACTIVE:
        reader.fail(
            f"{path}.minReplicas",
            "must be at least 1 for an interactive pool: a chat request cannot wait for a "
            "replica's cold start within its TTFT target",
        )
    batch = lane == Lane.BATCH
    default_signal = ScaleSignal.PROMPT_TOKENS if batch else ScaleSignal.IN_FLIGHT_REQUESTS
    chosen = (
        reader.choice(data, "signal", path, [s.value for s in ScaleSignal])
        if "signal" in data
        else None
    )
    signal = ScaleSignal(chosen) if chosen else default_signal
    target = reader.integer(
        data, "targetPerReplica", path, DEFAULT_TARGET_PER_REPLICA[signal], 1, MAX_TOKENS
    )
    floor = (
        reader.number(data, "minSloAttainment", path, 0.99, 0.0, 1.0)
        if data.get("minSloAttainment") is not None
        else None
    )
    return AutoscalingSpec(
        min_replicas=low,
        max_replicas=high,
        signal=signal,
        target_per_replica=target,
        scale_up_window_s=reader.integer(
            data, "scaleUpWindowSeconds", path, 0, 0, MAX_WINDOW_SECONDS
        ),
        scale_down_window_s=reader.integer(
            data, "scaleDownWindowSeconds", path, 300, 0, MAX_WINDOW_SECONDS
        ),
        min_slo_attainment=floor,
    )


def check_spec(spec: PoolSpec) -> list[FieldError]:
    """Cross-field rules: each error says what to change. The CRD's CEL rules mirror these."""
    return [
        *_check_chunking(spec.prefill, spec.limits),
        *_check_prompt_range(spec.routing, spec.limits),
        *_check_engine_flags(spec),
        *_check_field_combinations(spec),
    ]


def _check_chunking(prefill: PrefillSpec, limits: LimitsSpec) -> list[FieldError]:
    errors: list[FieldError] = []
    if prefill.chunked_prefill and prefill.chunk_size > prefill.token_budget:
        errors.append(
            FieldError(
                "spec.prefill.chunkSize",
                f"chunkSize ({prefill.chunk_size}) must not exceed tokenBudget "
                f"({prefill.token_budget}): lower chunkSize or raise tokenBudget",
            )
        )
    if prefill.chunked_prefill and prefill.chunk_size > limits.max_context_tokens:
        errors.append(
            FieldError(
                "spec.prefill.chunkSize",
                f"chunkSize ({prefill.chunk_size}) must not exceed limits.maxContextTokens "
                f"({limits.max_context_tokens}): a chunk longer than any prompt never splits one",
            )
        )
    return errors


def _check_prompt_range(routing: RoutingSpec, limits: LimitsSpec) -> list[FieldError]:
    errors: list[FieldError] = []
    if routing.max_prompt_tokens is not None:
        if routing.max_prompt_tokens > limits.max_context_tokens:
            errors.append(
                FieldError(
                    "spec.routing.maxPromptTokens",
                    f"maxPromptTokens ({routing.max_prompt_tokens}) must not exceed "
                    f"limits.maxContextTokens ({limits.max_context_tokens})",
                )
            )
        if routing.min_prompt_tokens > routing.max_prompt_tokens:
            errors.append(
                FieldError(
                    "spec.routing.minPromptTokens",
                    f"minPromptTokens ({routing.min_prompt_tokens}) must not exceed "
                    f"maxPromptTokens ({routing.max_prompt_tokens})",
                )
            )
    elif routing.min_prompt_tokens >= limits.max_context_tokens:
        errors.append(
            FieldError(
                "spec.routing.minPromptTokens",
                f"minPromptTokens ({routing.min_prompt_tokens}) must be below "
                f"limits.maxContextTokens ({limits.max_context_tokens})",
            )
        )
    return errors


def _check_engine_flags(spec: PoolSpec) -> list[FieldError]:
    """What each engine refuses at start-up, caught before a pod crash-loops on it."""
    errors: list[FieldError] = []
    prefill, limits = spec.prefill, spec.limits
    if spec.engine.kind is EngineKind.VLLM:
        # vLLM refuses to start when one step cannot hold one token per running sequence,
        # or, without chunking, one whole prompt of the maximum length.
        if prefill.token_budget < limits.max_concurrent_requests:
            errors.append(
                FieldError(
                    "spec.prefill.tokenBudget",
                    f"vLLM needs tokenBudget ({prefill.token_budget}) >= "
                    f"limits.maxConcurrentRequests ({limits.max_concurrent_requests})",
                )
            )
        if not prefill.chunked_prefill and prefill.token_budget < limits.max_context_tokens:
            errors.append(
                FieldError(
                    "spec.prefill.tokenBudget",
                    f"vLLM without chunked prefill needs tokenBudget ({prefill.token_budget}) "
                    f">= limits.maxContextTokens ({limits.max_context_tokens}): raise "
                    "tokenBudget or set prefill.chunkedPrefill: true",
                )
            )
        if prefill.max_partial_prefills != 1:
            # V1 stops at start-up on --max-num-partial-prefills other than 1 ("Concurrent
            # Partial Prefill is not supported"); v0.27 removed the flag altogether.
            errors.append(
                FieldError(
                    "spec.prefill.maxPartialPrefills",
                    f"vLLM's V1 engine does not support concurrent partial prefills: set "
                    f"maxPartialPrefills to 1, got {prefill.max_partial_prefills}",
                )
            )
    if spec.engine.kind is EngineKind.SGLANG and prefill.max_partial_prefills != 1:
        errors.append(
            FieldError(
                "spec.prefill.maxPartialPrefills",
                f"SGLang prefills one chunked prompt at a time: set maxPartialPrefills to 1, "
                f"got {prefill.max_partial_prefills}",
            )
        )
    return errors


def _check_field_combinations(spec: PoolSpec) -> list[FieldError]:
    errors: list[FieldError] = [*_check_kv_events(spec)]
    if spec.engine.simulator is not None and spec.engine.kind is not EngineKind.SIMULATOR:
        errors.append(
            FieldError(
                "spec.engine.simulator",
                f"is only for engine kind simulator, not {spec.engine.kind.value}: remove it",
            )
        )
    if spec.selector is not None and spec.autoscaling is not None:
        errors.append(
            FieldError(
                "spec.autoscaling", "cannot be set with spec.selector: adopted pods are not scaled"
            )
        )
    return errors


def _check_kv_events(spec: PoolSpec) -> list[FieldError]:
    """What the operator cannot render for engine.kvEvents; the CRD's CEL rules say the same."""
    kv_events = spec.engine.kv_events
    if kv_events is None:
        return []
    path = "spec.engine.kvEvents"
    errors: list[FieldError] = []
    if spec.engine.kind is EngineKind.SGLANG:
        # docs/OPERATOR.md, "The engines' KV events": SGLang v0.5.4's events carry
        # content-only block hashes (sequence-level since sgl-project/sglang#13488), and
        # its blocks are its --page-size, 1 token by default.
        errors.append(
            FieldError(
                path,
                "is for engine kind vllm or simulator: SGLang's KV events (v0.5.4, the "
                "operator's default image) do not chain their blocks as the gateway reads "
                "them; remove engine.kvEvents",
            )
        )
    simulator = spec.engine.kind is EngineKind.SIMULATOR
    if simulator and kv_events.block_size != SIMULATOR_KV_BLOCK_SIZE:
        errors.append(
            FieldError(
                f"{path}.blockSize",
                f"must be {SIMULATOR_KV_BLOCK_SIZE} for engine kind simulator (its KV blocks), "
                f"got {kv_events.block_size}",
            )
        )
    if spec.selector is not None:
        errors.append(
            FieldError(
                path,
                "cannot be set with spec.selector: the operator renders no engine pods for "
                "adopted ones; give those pods --kv-events-config themselves",
            )
        )
    rendered = [a for a in spec.engine.args if a.startswith(KV_EVENTS_RENDERED_FLAGS)]
    if rendered:
        errors.append(
            FieldError(
                "spec.engine.args",
                f"must not carry {rendered[0].split('=')[0]} with engine.kvEvents, which "
                "renders --kv-events-config and --block-size: remove it from engine.args "
                "(the block size is engine.kvEvents.blockSize)",
            )
        )
    return errors


def check_pool_set(pools: Sequence[InferencePool]) -> list[FieldError]:
    """Rules across pools: interactive pools serving one model must not overlap in range."""
    errors: list[FieldError] = []
    interactive = [p for p in pools if p.spec.lane is Lane.INTERACTIVE]
    for i, first in enumerate(interactive):
        for second in interactive[i + 1 :]:
            shared = set(first.spec.public_models) & set(second.spec.public_models)
            if not shared or first.spec.routing.tenants != second.spec.routing.tenants:
                continue
            low = max(first.spec.routing.min_prompt_tokens, second.spec.routing.min_prompt_tokens)
            high = min(first.spec.max_prompt_tokens, second.spec.max_prompt_tokens)
            if low <= high and first.spec.routing.priority == second.spec.routing.priority:
                errors.append(
                    FieldError(
                        f"{second.key}.spec.routing",
                        f"interactive prompt range overlaps pool {first.key} on model "
                        f"{sorted(shared)[0]!r} for {low}-{high} tokens with equal priority: "
                        "make the ranges disjoint or give one pool a higher routing.priority",
                    )
                )
    return errors
