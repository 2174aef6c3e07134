"""What an API server does with the InferencePool CRD's schema, done offline for tests.

A fast, offline stand-in for a real API server's three steps on a custom resource (the
real one judges the same cases in tests/test_cluster_crd.py): structural defaulting,
OpenAPI schema validation (through `jsonschema`), and the CEL rules in
`x-kubernetes-validations` (through `cel-python`, with Kubernetes' `self` binding).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
import yaml
from celpy.adapter import json_to_cel

from support import ROOT

CRD_PATH = ROOT / "crds" / "laneway.io_inferencepools.yaml"
# The Gateway API Inference Extension's InferencePool, written for the tests from its v1 API.
UPSTREAM_CRD_PATH = (
    ROOT / "tests" / "support" / "gateway_api" / ("inference.networking.k8s.io_inferencepools.yaml")
)
# Its InferenceObjective, written for the tests from its v1alpha2 API.
OBJECTIVE_CRD_PATH = UPSTREAM_CRD_PATH.with_name(
    "inference.networking.x-k8s.io_inferenceobjectives.yaml"
)
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))

Schema = dict[str, Any]


@functools.cache
def load_crd() -> dict[str, Any]:
    """The CRD as parsed once; callers must not change it."""
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return crd


def pool_schema() -> Schema:
    schema: Schema = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def upstream_schema() -> Schema:
    crd: dict[str, Any] = yaml.safe_load(UPSTREAM_CRD_PATH.read_text())
    schema: Schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def example_documents() -> list[dict[str, Any]]:
    return [d for path in EXAMPLES for d in yaml.safe_load_all(path.read_text()) if d]


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with its path (`.spec.prefill`, `.spec.engine.args[]`)."""
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Structural defaulting: fill absent properties that have a default, then recurse."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name, child in properties.items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
        for name, item in value.items():
            if name in properties:
                apply_defaults(properties[name], item)
            elif isinstance(schema.get("additionalProperties"), dict):
                apply_defaults(schema["additionalProperties"], item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def to_json_schema(schema: Schema) -> Schema:
    """The OpenAPI v3 (Kubernetes flavour) schema as JSON Schema. Unknown fields are
    errors, as with kubectl's default strict field validation."""
    converted: Schema = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("exclusiveMinimum", "exclusiveMaximum"):
            continue
        if key == "properties":
            converted[key] = {name: to_json_schema(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            converted[key] = to_json_schema(value)
        else:
            converted[key] = value
    if schema.get("exclusiveMinimum") is True:
        converted["exclusiveMinimum"] = converted.pop("minimum")
    if schema.get("x-kubernetes-int-or-string"):
        converted["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in schema
    ):
        converted["additionalProperties"] = False
    return converted


def schema_errors(document: dict[str, Any], schema: Schema | None = None) -> list[str]:
    validator = jsonschema.Draft7Validator(to_json_schema(schema or pool_schema()))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def _evaluate(rule: str, value: Any) -> bool:
    environment = celpy.Environment()
    program = environment.program(environment.compile(rule))
    return bool(program.evaluate({"self": json_to_cel(value)}))


def cel_failures(schema: Schema, value: Any, path: str = "") -> list[tuple[str, str]]:
    """(rule, message) of every CEL rule that rejects `value` (already defaulted)."""
    failures = [
        (rule["rule"], rule["message"])
        for rule in schema.get("x-kubernetes-validations") or ()
        if not _evaluate(rule["rule"], value)
    ]
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name, item in value.items():
            if name in properties:
                failures += cel_failures(properties[name], item, f"{path}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            failures += cel_failures(schema["items"], item, f"{path}[]")
    return failures


def admit(document: dict[str, Any], schema: Schema | None = None) -> list[str]:
    """What the API server would say about creating `document` (a laneway pool unless
    `schema` says otherwise, e.g. upstream_schema()): [] when it is accepted."""
    schema = schema or pool_schema()
    defaulted = apply_defaults(schema, copy.deepcopy(document))
    errors = schema_errors(defaulted, schema)
    if errors:
        return errors  # the API server runs CEL only on schema-valid objects
    return [message for _, message in cel_failures(schema, defaulted)]
