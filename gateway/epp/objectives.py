"""InferenceObjectives: the Gateway API Inference Extension's name for a kind of request,
with its priority (`inference.networking.x-k8s.io`, kind InferenceObjective), named by a
request's `x-llm-d-inference-objective` / `x-gateway-inference-objective` header.

`laneway epp --objectives FILE` reads them from the same YAML a platform team applies to
its cluster (one or more documents); `--watch-objectives` watches them in the cluster
(objectives_watch.py, the shell around `from_cluster` here). What is read:
`metadata.name` and `spec.priority` (an integer, higher more important, absent 0). What is
not: `spec.poolRef` (an objective applies in whichever pool its request is routed to:
laneway's lanes choose the pool), and the priority's other meaning in the ecosystem (a
negative one marks a request that may be shed first under saturation: laneway's lines and
caps decide that). Pure: no I/O but the file's read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


class ObjectivePriorities(Protocol):
    """What a request's stream asks: the file's Objectives, or the cluster's as watched."""

    def priority(self, name: str | None) -> int: ...


def load_objectives(path: str | Path) -> Objectives:
    """The InferenceObjective documents of `path`; UsageError naming file, document, field."""
    path = Path(path)
    priorities: dict[str, int] = {}
    for index, document in enumerate(read_yaml_documents(path, "objectives")):
        where = f"{path}: document {index}"
        name, priority = parse_objective(document, where)
        if name in priorities:
            raise UsageError(f"{where}: InferenceObjective {name!r} is defined twice")
        priorities[name] = priority
    return Objectives(priorities)


def from_cluster(objects: Mapping[str, Mapping[str, Any]]) -> tuple[Objectives, dict[str, str]]:
    """The InferenceObjectives seen in the cluster, by namespace/name: their priorities, and
    the invalid ones by key with the reason (left out, the rest served). The header names an
    objective by name alone, so one defined in several namespaces counts at the lowest of
    their priorities: no request is moved earlier than every namespace agrees to."""
    priorities: dict[str, int] = {}
    rejected: dict[str, str] = {}
    for key in sorted(objects):
        try:
            name, priority = parse_objective(objects[key], key)
        except UsageError as error:
            rejected[key] = str(error)
            continue
        priorities[name] = min(priority, priorities.get(name, priority))
    return Objectives(priorities), rejected


def parse_objective(value: object, where: str) -> tuple[str, int]:
    """One InferenceObjective's name and priority; UsageError naming `where` and the field."""
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
