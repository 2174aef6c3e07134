"""A container's command line as the kubelet starts it, for the tests of rendered engines."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def kubelet_argv(container: Mapping[str, Any], pod_ip: str) -> list[str]:
    """The container's command line as the kubelet starts it: each `$(NAME)` replaced by the
    container's env var NAME (a literal value, or the downward API's status.podIP), and a
    reference to no such variable left as written, as Kubernetes does."""
    values: dict[str, str] = {}
    for var in container.get("env", ()):
        if "value" in var:
            values[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            values[var["name"]] = pod_ip

    def expand(arg: str) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), arg)

    return [expand(arg) for arg in [*container["command"], *container["args"]]]
