"""The InferencePool CRD: structural, self-describing, in agreement with laneway.api, and
accepting every example. No API server runs here: `support.crd` stands in for its defaulting,
schema validation and CEL steps, and kubernetes-validate checks the CRD object itself
against the upstream apiextensions.k8s.io/v1 schema."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from support.crd import (
    EXAMPLES,
    apply_defaults,
    example_documents,
    load_crd,
    pool_schema,
    schema_errors,
    to_json_schema,
    walk,
)

from laneway import api

# Keys a structural schema may not use (apiextensions "structural schema" rules, plus
# references, which CRDs cannot resolve).
FORBIDDEN = {"$ref", "definitions", "allOf", "anyOf", "oneOf", "not", "dependencies"}


def test_crd_is_valid_against_the_upstream_apiextensions_schema() -> None:
    kubernetes_validate.validate(load_crd(), "1.37", strict=True)


def test_crd_names_scope_and_subresources() -> None:
    spec = load_crd()["spec"]
    assert (spec["group"], spec["scope"]) == (api.GROUP, "Namespaced")
    assert spec["names"]["kind"] == api.KIND
    assert spec["names"]["plural"] == api.PLURAL
    assert spec["names"]["shortNames"] == ["lwpool"]
    assert spec["names"]["categories"] == ["laneway"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (api.VERSION, True, True)
    assert version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]
    paths = {path for path, _ in walk(pool_schema())}
    for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
        assert scale[key] in paths, key


def test_printer_columns_point_at_schema_fields() -> None:
    (version,) = load_crd()["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Lane", "Engine", "Model", "Ready", "SLO", "Context", "Age"]
    paths = {path for path, _ in walk(pool_schema())}
    for name, path in columns.items():
        assert path in paths or path == ".metadata.creationTimestamp", name


def test_schema_is_structural() -> None:
    schema = pool_schema()
    assert schema["properties"]["metadata"] == {"type": "object"}
    for path, node in walk(schema):
        assert not FORBIDDEN & node.keys(), f"{path} uses {FORBIDDEN & node.keys()}"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, (
            f"{path} has no type"
        )
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "array":
            assert isinstance(node.get("items"), dict), f"{path} has no items schema"
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", ())), path


def test_every_field_is_described_for_kubectl_explain() -> None:
    undocumented = [
        path
        for path, node in walk(pool_schema())
        if path and path != ".metadata" and not path.endswith(("[]", "{}"))
        if not node.get("description")
    ]
    assert undocumented == []


def test_every_cel_rule_has_a_message_and_a_field_path() -> None:
    rules = [r for _, node in walk(pool_schema()) for r in node.get("x-kubernetes-validations", ())]
    assert len(rules) >= 10
    for rule in rules:
        assert rule["message"].strip(), rule["rule"]
        assert rule["fieldPath"].startswith("."), rule["rule"]


def test_defaults_validate_against_their_own_schema() -> None:
    for path, node in walk(pool_schema()):
        if "default" in node:
            value = apply_defaults(node, copy.deepcopy(node["default"]))
            jsonschema.Draft7Validator(to_json_schema(node)).validate(value)
            assert path.startswith(".spec"), f"{path}: defaults belong in spec"


def _node(path: str) -> dict[str, Any]:
    return dict(walk(pool_schema()))[path]


def test_defaults_and_enums_agree_with_the_api_model() -> None:
    prefill, limits, slo, routing = (
        api.PrefillSpec(),
        api.LimitsSpec(),
        api.SLOSpec(),
        api.RoutingSpec(models=()),
    )
    expected = {
        ".spec.prefill.chunkedPrefill": prefill.chunked_prefill,
        ".spec.prefill.chunkSize": prefill.chunk_size,
        ".spec.prefill.tokenBudget": prefill.token_budget,
        ".spec.prefill.maxPartialPrefills": prefill.max_partial_prefills,
        ".spec.limits.maxContextTokens": limits.max_context_tokens,
        ".spec.limits.maxConcurrentRequests": limits.max_concurrent_requests,
        ".spec.slo.ttftMillis": slo.ttft_millis,
        ".spec.slo.tbtMillis": slo.tbt_millis,
        ".spec.routing.minPromptTokens": routing.min_prompt_tokens,
        ".spec.routing.priority": routing.priority,
        ".spec.routing.allowLaneHeader": routing.allow_lane_header,
        ".spec.replicas": 1,
        ".spec.port": 8000,
        ".spec.engine.simulator.profile": api.SimulatorSpec().profile,
        ".spec.engine.simulator.timeScale": api.SimulatorSpec().time_scale,
        ".spec.engine.simulator.metricsFlavor": api.SimulatorSpec().metrics_flavor.value,
        ".spec.engine.kvEvents.blockSize": api.DEFAULT_KV_EVENT_BLOCK_SIZE,
    }
    for path, value in expected.items():
        assert _node(path)["default"] == value, path
    assert _node(".spec.lane")["enum"] == [lane.value for lane in api.Lane]
    assert _node(".spec.engine.kind")["enum"] == [kind.value for kind in api.EngineKind]
    assert _node(".spec.engine.simulator.metricsFlavor")["enum"] == [
        flavor.value for flavor in api.MetricsFlavor
    ]
    for path in (".spec.prefill.chunkSize", ".spec.prefill.tokenBudget"):
        assert _node(path)["maximum"] == api.MAX_TOKENS
    assert _node(".spec.limits.maxContextTokens")["maximum"] == api.MAX_TOKENS
    assert _node(".spec.limits.maxConcurrentRequests")["maximum"] == api.MAX_CONCURRENT_REQUESTS
    assert _node(".spec.prefill.maxPartialPrefills")["maximum"] == api.MAX_PARTIAL_PREFILLS
    assert _node(".spec.replicas")["maximum"] == api.MAX_REPLICAS
    assert _node(".spec.engine.kvEvents.blockSize")["enum"] == list(api.KV_EVENT_BLOCK_SIZES)
    # The endpoint's CEL rule and parse_pool match the same pattern.
    (endpoint_rule,) = _node(".spec.engine.kvEvents")["x-kubernetes-validations"]
    assert endpoint_rule["rule"] == f"self.endpoint.matches('{api.KV_EVENTS_ENDPOINT_PATTERN}')"


@pytest.mark.parametrize(
    "document", example_documents(), ids=lambda d: d["metadata"]["name"] if d else ""
)
def test_examples_pass_the_crd_schema_and_parse(document: dict[str, Any]) -> None:
    defaulted = apply_defaults(pool_schema(), dict(document))
    assert schema_errors(defaulted) == []
    api.parse_pool(document)


def test_examples_cover_both_lanes_every_engine_and_the_seed_caps() -> None:
    assert len(EXAMPLES) >= 3
    pools = [api.parse_pool(d) for d in example_documents()]
    assert {(p.spec.lane, p.spec.engine.kind) for p in pools} >= {
        (api.Lane.INTERACTIVE, api.EngineKind.VLLM),
        (api.Lane.BATCH, api.EngineKind.SGLANG),
        (api.Lane.INTERACTIVE, api.EngineKind.SIMULATOR),
        (api.Lane.BATCH, api.EngineKind.SIMULATOR),
    }
    realtime = next(p for p in pools if p.spec.engine.kind is api.EngineKind.VLLM)
    assert realtime.spec.limits.max_context_tokens == 4096
    batch = next(p for p in pools if p.spec.engine.kind is api.EngineKind.SGLANG)
    assert batch.spec.prefill.chunked_prefill
    assert batch.spec.limits.max_context_tokens == 131072
    assert api.check_pool_set(pools) == []


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"lane": "realtime"}, "lane"),
        ({"engine": {"kind": "tgi"}}, "engine.kind"),
        ({"prefill": {"chunkSize": 8}}, "chunkSize"),
        ({"limits": {"maxContextTokens": 8_000_000}}, "maxContextTokens"),
        ({"replicas": -1}, "replicas"),
        ({"port": 70000}, "port"),
        ({"selector": {"matchLabels": {}}}, "matchLabels"),
        ({"engine": {"kind": "simulator", "simulator": {"timeScale": 0}}}, "timeScale"),
        ({"routing": {"modelz": ["x"]}}, "modelz"),
        ({"prefill": {"tokenBudget": "2048"}}, "tokenBudget"),
        ({"engine": {"kind": "simulator", "kvEvents": {"blockSize": 16}}}, "endpoint"),
        (
            {"engine": {"kind": "vllm", "kvEvents": {"endpoint": "tcp://gw:1", "blockSize": 24}}},
            "blockSize",
        ),
        (
            {"engine": {"kind": "vllm", "kvEvents": {"endpoint": "tcp://gw:1", "topic": "t"}}},
            "topic",
        ),
    ],
)
def test_schema_rejects_bad_fields(patch: dict[str, Any], needle: str) -> None:
    document = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "p"},
        "spec": {"lane": "batch", "model": "m", "engine": {"kind": "simulator"}, **patch},
    }
    errors = schema_errors(apply_defaults(pool_schema(), document))
    assert errors, patch
    assert any(needle in error for error in errors), errors
    with pytest.raises(api.SpecError):
        api.parse_pool(document)
