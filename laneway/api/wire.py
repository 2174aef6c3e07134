"""The base of every InferencePool model: how a field is spelled and checked on the wire.

Each model is a frozen pydantic model whose field names are the Python attributes and whose
aliases (camelCase) are the resource's field names. Documents are validated as the API
server reads them, as JSON (`laneway.api.parse`): no string is taken for a number and no
list for a string, and a field the schema does not name is an error.

What a field's declaration means for the CRD (`laneway.api.crd`):
- `default=` is also the API server's default: it fills the field in the stored object.
- `default_factory=` is the parser's default alone: the stored object leaves the field out
  (a CEL rule may ask whether it was set, or the default depends on other fields).
- `description=` is what `kubectl explain` and docs/OPERATOR.md say about the field.
- `json_schema_extra=` carries what JSON Schema cannot say: CEL rules
  (`x-kubernetes-validations`) and other Kubernetes extensions.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        # Python code builds models by attribute name; documents use the wire names only
        # (parse.py validates with by_name=False).
        validate_by_name=True,
        validate_by_alias=True,
        strict=True,
    )


def rules(*validations: dict[str, str]) -> dict[str, Any]:
    """CEL rules of one object, for its model's `json_schema_extra`."""
    return {"x-kubernetes-validations": list(validations)}


def rule(cel: str, field_path: str, message: str) -> dict[str, str]:
    """One CEL rule: `field_path` (relative, `.chunkSize`) names the field that is wrong and
    `message` says what to change, as the API server reports it."""
    return {"rule": cel, "fieldPath": field_path, "message": message}
