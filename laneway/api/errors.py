"""What a wrong InferencePool document gets: every wrong field by its dotted path, with what
to change. Pydantic's errors are worded from the schema node they point at, so a message
names the same bounds and choices the CRD does."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from laneway.api.schema import Schema, pool_schema


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


def type_name(value: object) -> str:
    return {list: "a list", str: "a string", int: "an integer", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def field_errors(error: ValidationError) -> list[FieldError]:
    """One FieldError per wrong field of a PoolDocument, in document order."""
    found: dict[str, str] = {}
    for detail in error.errors(include_url=False):
        if detail["type"] == "default_factory_not_called":
            continue  # a field whose default reads another field that is wrong itself
        path, message = _describe(pool_schema(), detail)
        found.setdefault(path, message)
    return [FieldError(path, message) for path, message in found.items()]


_SCALAR_TYPES = {"string", "integer", "number", "boolean"}
# Pydantic's own error types: worded here. Any other type is a validator's own message.
_WORDED = {
    "missing",
    "extra_forbidden",
    "string_type",
    "string_too_short",
    "string_too_long",
    "int_type",
    "int_parsing",
    "int_from_float",
    "float_type",
    "float_parsing",
    "bool_type",
    "bool_parsing",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "enum",
    "literal_error",
    "dict_type",
    "model_type",
    "model_attributes_type",
    "list_type",
    "tuple_type",
    "too_short",
    "too_long",
}


def _describe(schema: Schema, detail: ErrorDetails) -> tuple[str, str]:
    """(path, message) for one error; an error inside a list of scalars or a map's values
    is the collection's, as `must be a list of non-empty strings`."""
    kind, node, parent, path = detail["type"], schema, schema, ""
    for key in detail["loc"]:
        if isinstance(key, int):
            items = node.get("items", {})
            if kind in _WORDED and _is_scalar(items):
                return path, f"must be a list of {_plural(items)}"
            node, path = items, f"{path}[{key}]"
        elif key in node.get("properties", {}):
            parent, node = node, node["properties"][key]
            path = f"{path}.{key}" if path else key
        elif isinstance(node.get("additionalProperties"), dict):
            return path, f"must map strings to {_plural(node['additionalProperties'])}"
        elif node.get("x-kubernetes-int-or-string"):
            break  # the member of `int | str` pydantic tried: the field's error, once
        else:  # a key the schema does not name
            parent, node = node, {}
            path = f"{path}.{key}" if path else str(key)
    if kind not in _WORDED:
        return path, detail["msg"]
    return path, _worded(kind, detail, node, parent, path)


def _worded(kind: str, detail: ErrorDetails, node: Schema, parent: Schema, path: str) -> str:
    value: Any = detail.get("input")
    ctx: dict[str, Any] = dict(detail.get("ctx") or {})
    choices = ", ".join(str(choice) for choice in node.get("enum", ()))
    if kind == "missing":
        return f"is required, one of {choices}" if choices else "is required"
    if kind == "extra_forbidden":
        fields = list(parent.get("properties", {}))
        close = difflib.get_close_matches(path.rsplit(".", 1)[-1], fields, n=1)
        return (
            f"is not a field; did you mean {close[0]}?"
            if close
            else (f"is not a field; fields: {', '.join(fields)}")
        )
    if kind in ("enum", "literal_error"):
        return f"must be one of {choices}, got {value!r}"
    if kind in ("greater_than", "less_than_equal") and node.get("exclusiveMinimum"):
        return f"must be above {node['minimum']} and at most {node['maximum']}, got {value}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}, got {value}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}, got {value}"
    if kind == "greater_than":
        return f"must be above {ctx['gt']}, got {value}"
    if kind == "less_than":
        return f"must be below {ctx['lt']}, got {value}"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters, got {len(value)}"
    if kind in ("too_long", "too_short"):
        most = "most" if kind == "too_long" else "least"
        limit = ctx["max_length" if kind == "too_long" else "min_length"]
        return f"must have at {most} {limit} entries, got {ctx['actual_length']}"
    return _shape(node, value)


def _shape(node: Schema, value: Any) -> str:
    """For a value of the wrong type (or an empty string): what the field takes."""
    kind = node.get("type")
    if kind == "object":
        return f"must be an object, got {type_name(value)}"
    if kind == "array":
        return f"must be a list of {_plural(node.get('items', {}))}"
    if kind == "string":
        return f"must be a non-empty string, got {value!r}"
    if kind == "integer":
        return f"must be an integer, got {value!r}"
    if kind == "number":
        return f"must be a number, got {value!r}"
    if kind == "boolean":
        return f"must be true or false, got {value!r}"
    return f"must be an integer or a string, got {value!r}"


def _is_scalar(node: Schema) -> bool:
    return node.get("type") in _SCALAR_TYPES or bool(node.get("x-kubernetes-int-or-string"))


def _plural(node: Schema) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "integers or strings"
    kind = node.get("type")
    if kind == "string":
        return "non-empty strings" if node.get("minLength") else "strings"
    return {"integer": "integers", "number": "numbers", "boolean": "booleans"}.get(
        str(kind), "objects"
    )
