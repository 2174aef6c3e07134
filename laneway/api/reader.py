"""A reader of typed fields out of nested mappings, collecting every error with its path:
what the gateway's own GatewayConfig document is parsed with (gateway/config.py)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from laneway.api.errors import FieldError, type_name


class Reader:
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
            self.fail(f"{path}.{key}", f"must be an object, got {type_name(value)}")
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
