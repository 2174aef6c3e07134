"""parse_pool: one InferencePool document in, a frozen `InferencePool` or a `SpecError` out.

Every consumer calls it: the gateway's YAML config and Kubernetes watcher, the operator and
`laneway render`. It runs at load and on watch events, never per request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from laneway.api.checks import check_spec
from laneway.api.errors import SpecError, field_errors
from laneway.api.resource import InferencePool, PoolDocument


def parse_pool(document: Mapping[str, Any]) -> InferencePool:
    """Parse and validate one InferencePool document; raise SpecError naming every problem."""
    # As JSON, as kubectl sends a YAML document and the API server reads it: "2048" is no
    # integer, and a YAML date is a string.
    wire = json.dumps(_as_json(document), default=str)
    try:
        parsed = PoolDocument.model_validate_json(wire, by_alias=True, by_name=False)
    except ValidationError as error:
        raise SpecError(field_errors(error)) from None
    errors = check_spec(parsed.spec)
    if errors:
        raise SpecError(errors)
    return InferencePool(
        name=parsed.metadata.name,
        namespace=parsed.metadata.namespace,
        spec=parsed.spec,
        generation=parsed.metadata.generation,
        uid=parsed.metadata.uid,
        endpoints=parsed.status.endpoints,
    )


def _as_json(value: Any) -> Any:
    """`value` with string keys, and without the fields set to null: the API server prunes
    those, so null and absent are one to both."""
    if isinstance(value, Mapping):
        return {str(k): _as_json(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_as_json(v) for v in value]
    return value
