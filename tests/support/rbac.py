"""What a role in manifests/rbac/ grants, and what RBAC checks for a recorded API request."""

from __future__ import annotations

import yaml

from support import ROOT
from support.apiserver import Request

RBAC = ROOT / "manifests" / "rbac"


def granted_rules(component: str) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) for every rule of manifests/rbac/COMPONENT.yaml's ClusterRole."""
    path = RBAC / f"{component}.yaml"
    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ClusterRole")
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rbac_call(request: Request) -> tuple[str, str, str]:
    """(API group, resource[/subresource], verb) that RBAC checks for a request."""
    parts = request.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[:1] == ["namespaces"]:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    if request.method == "GET":
        verb = (
            "watch" if request.query.get("watch") == "true" else "get" if len(rest) > 1 else "list"
        )
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[
            request.method
        ]
    return group, resource, verb
