"""The chart's RBAC: exactly the documented rules, nothing beyond the release's namespace
unless asked, no wildcard."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.chart import (
    CHART,
    CLUSTER_SCOPED,
    CLUSTER_WIDE_SETS,
    NAMESPACE,
    RELEASE,
    Manifest,
    container,
    deployment,
    env_of,
    kinds,
    only,
    run_helm,
)

from laneway import __version__

# --- RBAC -------------------------------------------------------------------------------

READ = {"get", "list", "watch"}


def rules_of(objects: list[Manifest], kind: str, suffix: str) -> dict[tuple[str, str], set[str]]:
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in only(objects, kind, suffix)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules[(group, resource)] = set(rule["verbs"])
    return rules


def documented_rules(component: str) -> dict[tuple[str, str], set[str]]:
    """The rules manifests/rbac/ grants a component, which the component's own tests check
    against the API calls it makes."""
    path = ROOT / "manifests" / "rbac" / f"{component}.yaml"
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return rules_of(documents, "ClusterRole", f"laneway-{component}")


@pytest.mark.parametrize("value_set", ["default", *CLUSTER_WIDE_SETS])
def test_roles_grant_exactly_the_documented_rules(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = rendered[value_set]
    kind = "ClusterRole" if value_set in CLUSTER_WIDE_SETS else "Role"
    gateway = rules_of(objects, kind, "-gateway")
    assert gateway == documented_rules("gateway")
    assert all(verbs <= READ for verbs in gateway.values()), "the gateway only reads"
    assert rules_of(objects, kind, "-operator") == documented_rules("operator")
    if kind == "ClusterRole":
        names = {o["metadata"]["name"] for o in objects if o["kind"] in CLUSTER_SCOPED}
        assert all(name.startswith(f"{NAMESPACE}-") for name in names), "no clash across releases"


def test_a_record_asking_for_crd_access_fails_rendering(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "laneway"
    shutil.copytree(CHART, chart)
    record = chart / "files" / "rbac-operator.yaml"
    documents = [d for d in yaml.safe_load_all(record.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "ClusterRole")
    role["rules"].append(
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list"],
        }
    )
    record.write_text(yaml.safe_dump_all(documents))
    result = run_helm(helm, "template", RELEASE, str(chart))
    assert result.returncode != 0
    assert "asks for CRD access, which a namespaced Role cannot grant" in result.stderr


def test_nothing_is_granted_beyond_the_release_namespace_unless_asked(
    rendered: dict[str, list[Manifest]],
) -> None:
    for value_set, objects in rendered.items():
        assert bool(kinds(objects) & CLUSTER_SCOPED) == (value_set in CLUSTER_WIDE_SETS)
    operator = container(deployment(rendered["production"], "operator"))
    assert "--namespace" not in operator["args"], "the operator's default: every namespace"


def test_no_rule_uses_a_wildcard_and_bindings_name_rendered_accounts(
    rendered: dict[str, list[Manifest]],
) -> None:
    for objects in rendered.values():
        accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
        for manifest in objects:
            for rule in manifest.get("rules", []):
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[key], manifest["metadata"]["name"]
            if manifest["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                roles = {
                    o["metadata"]["name"]
                    for o in objects
                    if o["kind"] == manifest["roleRef"]["kind"]
                }
                assert manifest["roleRef"]["name"] in roles
                for subject in manifest["subjects"]:
                    assert subject["name"] in accounts
                    assert subject["namespace"] == NAMESPACE
        for manifest in objects:
            if manifest["kind"] == "Deployment" and manifest["metadata"]["name"].endswith(
                ("-gateway", "-operator")
            ):
                assert manifest["spec"]["template"]["spec"]["serviceAccountName"] in accounts


def test_operator_off_renders_no_operator_objects(rendered: dict[str, list[Manifest]]) -> None:
    objects = rendered["operator-off"]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-operator")]
    deployment(objects, "gateway")
    operator = container(deployment(rendered["default"], "operator"))
    assert operator["args"][:3] == ["operator", "--namespace", NAMESPACE]
    health_port = int(operator["args"][operator["args"].index("--health-port") + 1])
    assert operator["ports"] == [
        {"name": "health", "containerPort": health_port, "protocol": "TCP"}
    ]
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "LANEWAY_IMAGE", "value": f"laneway:{__version__}"} in operator["env"]


def test_operator_reads_demand_from_the_releases_gateway_service(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["default"]
    service = only(objects, "Service", "-gateway")
    # /laneway/demand is served on the metrics port (no API key there; the API port asks one).
    metrics_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics")
    gateway_url = env_of(deployment(objects, "operator"))["LANEWAY_GATEWAY_URL"]["value"]
    assert gateway_url == f"http://{service['metadata']['name']}.{NAMESPACE}:{metrics_port}"
