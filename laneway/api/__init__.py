"""The InferencePool API (`laneway.io/v1alpha1`), written once.

The pydantic models (`spec.py`, `engine.py`, `tokenizer.py`, `scaling.py`, `resource.py`)
are the one statement of every field: its wire name, type, bounds, default, description
and the CEL rules across fields. From them come
- the parser: `parse_pool` returns the frozen models (or a `SpecError` that names every
  wrong field and says what to change), for the gateway, the operator and `laneway render`;
- the CRD and the field table of docs/OPERATOR.md: `python -m laneway.api.crd` writes them
  (`laneway.api.crd`, `laneway.api.schema`), and a test fails when the committed ones differ.
"""

from laneway.api.checks import check_pool_set, check_spec
from laneway.api.engine import (
    EngineKind,
    EngineSpec,
    KVEventsSpec,
    MetricsFlavor,
    SimulatorSpec,
)
from laneway.api.errors import FieldError, SpecError
from laneway.api.names import (
    API_VERSION,
    DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS,
    DEFAULT_KV_EVENT_BLOCK_SIZE,
    GROUP,
    KIND,
    KV_EVENT_BLOCK_SIZES,
    KV_EVENTS_ENDPOINT_PATTERN,
    KV_EVENTS_RENDERED_FLAGS,
    MAX_CONCURRENT_REQUESTS,
    MAX_PARTIAL_PREFILLS,
    MAX_REPLICAS,
    MAX_TIME_SCALE,
    MAX_TOKENS,
    MAX_WINDOW_SECONDS,
    PLURAL,
    POOL_LABEL,
    SIMULATOR_KV_BLOCK_SIZE,
    VERSION,
)
from laneway.api.parse import parse_pool
from laneway.api.reader import Reader as _Reader
from laneway.api.resource import InferencePool
from laneway.api.scaling import DEFAULT_TARGET_PER_REPLICA, AutoscalingSpec
from laneway.api.spec import (
    Lane,
    LimitsSpec,
    PoolSpec,
    PrefillSpec,
    RoutingSpec,
    SchedulingPolicy,
    SchedulingSpec,
    SLOSpec,
)
from laneway.api.tokenizer import TokenizerKind, TokenizerSpec

__all__ = [
    "API_VERSION",
    "DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS",
    "DEFAULT_KV_EVENT_BLOCK_SIZE",
    "DEFAULT_TARGET_PER_REPLICA",
    "GROUP",
    "KIND",
    "KV_EVENTS_ENDPOINT_PATTERN",
    "KV_EVENTS_RENDERED_FLAGS",
    "KV_EVENT_BLOCK_SIZES",
    "MAX_CONCURRENT_REQUESTS",
    "MAX_PARTIAL_PREFILLS",
    "MAX_REPLICAS",
    "MAX_TIME_SCALE",
    "MAX_TOKENS",
    "MAX_WINDOW_SECONDS",
    "PLURAL",
    "POOL_LABEL",
    "SIMULATOR_KV_BLOCK_SIZE",
    "VERSION",
    "AutoscalingSpec",
    "EngineKind",
    "EngineSpec",
    "FieldError",
    "InferencePool",
    "KVEventsSpec",
    "Lane",
    "LimitsSpec",
    "MetricsFlavor",
    "PoolSpec",
    "PrefillSpec",
    "RoutingSpec",
    "SLOSpec",
    "SchedulingPolicy",
    "SchedulingSpec",
    "SimulatorSpec",
    "SpecError",
    "TokenizerKind",
    "TokenizerSpec",
    "_Reader",
    "check_pool_set",
    "check_spec",
    "parse_pool",
]
