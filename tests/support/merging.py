"""Overlaying nested dicts, as Helm merges values files and tests vary a base spec."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merged(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """The parts overlaid left to right: dicts merge key by key, a later value replaces
    anything else. The result shares nothing with the parts."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out
