"""parse_pool: one InferencePool document in, a frozen `InferencePool` or a `SpecError` out.

Every consumer calls it: the gateway's YAML config and Kubernetes watcher, the operator and
`laneway render`. It runs at load and on watch events, never per request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError

from laneway.api.checks import check_spec
from laneway.api.errors import SpecError, field_errors
from laneway.api.resource import InferencePool, PoolDocument


def parse_pool(document: Mapping[str, Any]) -> InferencePool:
    """Parse and validate one InferencePool document; raise SpecError naming every problem."""
    # As JSON, the API server's reading: a YAML document's "2048" is no integer, and its
    # dates are the strings the API server would hold.
    wire = orjson.dumps(_without_nulls(document), default=str, option=orjson.OPT_NON_STR_KEYS)
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


def _without_nulls(value: Any) -> Any:
    """A field set to null is a field left out, as `kubectl apply` treats it."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_nulls(v) for v in value]
    return value
