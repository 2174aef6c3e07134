"""The models' JSON Schema as a structural Kubernetes schema: the CRD's openAPIV3Schema.

Pydantic writes JSON Schema 2020-12; the API server reads OpenAPI v3 with Kubernetes'
structural rules. The translation, node by node:
- `$ref`s are inlined (a CRD cannot resolve them); the field's own keys win over its
  model's, and a model's docstring is left behind (the field's description says what it is
  there);
- `X | None` (anyOf with null) is X: absent and null are the same to the parser, and
  Kubernetes would otherwise need `nullable`; `int | str` is `x-kubernetes-int-or-string`;
- a number bound `exclusiveMinimum: N` is OpenAPI v3's `minimum: N, exclusiveMinimum: true`;
- `additionalProperties: false` goes (the API server prunes and, under strict field
  validation, reports unknown fields), `true` becomes `x-kubernetes-preserve-unknown-fields`;
- titles and null defaults go; every other key, `x-kubernetes-*` included, stays.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

from laneway.api.resource import PoolDocument

Schema = dict[str, Any]

# The order keys are written in: what a node is, its bounds, its words, then its children.
KEY_ORDER = (
    "type",
    "format",
    "enum",
    "exclusiveMinimum",
    "minimum",
    "exclusiveMaximum",
    "maximum",
    "minLength",
    "maxLength",
    "maxItems",
    "minProperties",
    "default",
    "description",
    "required",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
    "properties",
    "items",
    "additionalProperties",
)
_DROPPED = {"title", "$defs"}


class _AsWritten(GenerateJsonSchema):
    """Keys in the order the models write them (pydantic sorts them by default)."""

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        return value


def structural(model: type[BaseModel]) -> Schema:
    """`model`'s validation schema, by wire names, in the API server's form."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_AsWritten)
    return _node(raw, raw.get("$defs", {}))


@functools.cache
def pool_schema() -> Schema:
    """The InferencePool CRD's openAPIV3Schema; callers must not change it."""
    return structural(PoolDocument)


def _node(schema: Schema, defs: Schema) -> Schema:
    out: Schema = {}
    for key, value in _resolved(schema, defs).items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: _node(child, defs) for name, child in value.items()}
        elif key == "items":
            out[key] = _node(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out[key] = _node(value, defs)
            elif value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "description":
            out[key] = " ".join(value.split())
        else:
            out[key] = value
    return _ordered(out)


def _resolved(schema: Schema, defs: Schema) -> Schema:
    """`schema` as one node: its `$ref` and its `X | None` taken in, its own keys winning."""
    node = dict(schema)
    members = node.pop("anyOf", None)
    if members is not None:
        present = [m for m in members if m != {"type": "null"}]
        if len(present) == 1:
            node = {**_resolved(present[0], defs), **node}
        elif sorted(m.get("type", "") for m in present) == ["integer", "string"]:
            node["x-kubernetes-int-or-string"] = True
        else:
            raise ValueError(f"a union with no structural form: {members}")
    ref = node.pop("$ref", None)
    if ref is not None:
        target = dict(defs[ref.rsplit("/", 1)[-1]])
        target.pop("description", None)  # the model's docstring, not this field's words
        node = {**target, **node}
    return node


def _ordered(node: Schema) -> Schema:
    unknown = set(node) - set(KEY_ORDER)
    if unknown:
        raise ValueError(f"schema keys with no place in a CRD: {sorted(unknown)}")
    return {key: node[key] for key in KEY_ORDER if key in node}
