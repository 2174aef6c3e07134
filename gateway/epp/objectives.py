"""InferenceObjectives: the Gateway API Inference Extension's name for a kind of request,
with its priority (`inference.networking.x-k8s.io`, kind InferenceObjective), named by a
request's `x-llm-d-inference-objective` / `x-gateway-inference-objective` header.

`laneway epp --objectives FILE` reads them from the same YAML a platform team applies to
its cluster (one or more documents). What is read: `metadata.name` and `spec.priority`
(an integer, higher more important, absent 0). What is not: `spec.poolRef` (an objective
applies in whichever pool its request is routed to: laneway's lanes choose the pool), and
the priority's other meaning in the ecosystem (a negative one marks a request that may be
shed first under saturation: laneway's lines and caps decide that). Pure: no I/O but the
file's read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from laneway.errors import UsageError
from laneway.yaml_files import mapping, read_yaml_documents

GROUP = "inference.networking.x-k8s.io"
KIND = "InferenceObjective"


@dataclass(frozen=True)
class Objectives:
    """Objective name -> its priority, higher more important."""

    priorities: Mapping[str, int]

    def priority(self, name: str | None) -> int:
        """The objective's priority; 0 for no objective or one not known here."""
        return self.priorities.get(name, 0) if name else 0


NO_OBJECTIVES = Objectives({})


def load_objectives(path: str | Path) -> Objectives:
    """The InferenceObjective documents of `path`; UsageError naming file, document, field."""
    path = Path(path)
    priorities: dict[str, int] = {}
    for index, document in enumerate(read_yaml_documents(path, "objectives")):
        where = f"{path}: document {index}"
        name, priority = _parse(document, where)
        if name in priorities:
            raise UsageError(f"{where}: InferenceObjective {name!r} is defined twice")
        priorities[name] = priority
    return Objectives(priorities)


def _parse(value: object, where: str) -> tuple[str, int]:
    document = mapping(value, where)
    version = document.get("apiVersion")
    if document.get("kind") != KIND or not (
        isinstance(version, str) and version.startswith(f"{GROUP}/")
    ):
        raise UsageError(
            f"{where}: must be a {KIND} of {GROUP}, got {document.get('kind')!r} of {version!r}"
        )
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: metadata.name must be a non-empty string")
    spec = document.get("spec")
    spec = mapping({} if spec is None else spec, f"{where} ({name}): spec")
    priority = spec.get("priority")
    if priority is None:
        priority = 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise UsageError(f"{where} ({name}): spec.priority must be an integer, got {priority!r}")
    return name, priority
