"""The Helm chart as `helm template` renders it, and the objects tests look for in it."""

from __future__ import annotations

import argparse
import itertools
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from laneway.bench.harness.procs import laneway_argv
from laneway.cli import build_parser
from support import ROOT

CHART = ROOT / "charts" / "laneway"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = ["default", *(path.name.removesuffix("-values.yaml") for path in CI_VALUES)]
RELEASE, NAMESPACE = "lw", "serving"
# The oldest Kubernetes Chart.yaml's kubeVersion admits, and the newest schemas installed.
KUBERNETES_VERSIONS = ("1.27", kubernetes_validate.latest_version())
# Kinds that are not built into Kubernetes: checked by their own tests.
CUSTOM_KINDS = {"InferencePool", "ServiceMonitor"}
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)

Manifest = dict[str, Any]


def values_args(value_set: str) -> list[str]:
    return [] if value_set == "default" else ["-f", str(CHART / "ci" / f"{value_set}-values.yaml")]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


def template(helm: str, *args: str) -> list[Manifest]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def only(objects: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = [
        o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def kinds(objects: list[Manifest]) -> set[str]:
    return {o["kind"] for o in objects}


def deployment(objects: list[Manifest], component: str) -> Manifest:
    return only(objects, "Deployment", f"-{component}")


def container(deployment_object: Manifest) -> Manifest:
    containers = deployment_object["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Manifest = containers[0]
    return result


def env_of(deployment_object: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container(deployment_object).get("env", [])}


def crd() -> Manifest:
    document: Manifest = yaml.safe_load(
        (CHART / "crds" / "laneway.io_inferencepools.yaml").read_text()
    )
    return document


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}
CLUSTER_WIDE_SETS = [s for s in VALUE_SETS if s == "production"]  # watchAllNamespaces: true
ENGINE_NAMESPACES = ("inference",)  # production's networkPolicy.engineNamespaces


def gateway_config_documents(objects: list[Manifest]) -> list[Any]:
    config_map = only(objects, "ConfigMap", "-gateway")
    return list(yaml.safe_load_all(config_map["data"]["gateway.yaml"]))


def nested(dotted: str, value: Any) -> Manifest:
    """{"a.b": 1} style shorthand -> {"a": {"b": 1}}."""
    result: Any = value
    for key in reversed(dotted.split(".")):
        result = {key: result}
    return dict(result)


def parse_laneway(argv: list[str]) -> argparse.Namespace:
    """Parse a container's args with the real `laneway` parser; fail on what it rejects."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as error:
        pytest.fail(f"laneway rejects {argv}: exit {error.code}")


def tenants_volume(gateway: Manifest) -> Manifest:
    """The volume mounted where the gateway's --tenants points."""
    args = container(gateway)["args"]
    path = args[args.index("--tenants") + 1]
    mount = next(m for m in container(gateway)["volumeMounts"] if m["mountPath"] == path)
    volumes = gateway["spec"]["template"]["spec"]["volumes"]
    volume: Manifest = next(v for v in volumes if v["name"] == mount["name"])
    return volume


def access_flags(operator_args: list[str]) -> list[str]:
    """The operator's --allowed-* flags with their values, which `laneway render` takes too."""
    flags = []
    for flag, value in itertools.pairwise(operator_args):
        if flag.startswith("--allowed-"):
            flags += [flag, value]
    return flags


def operator_render(
    pools: list[Manifest], image: str, flags: list[str] | None = None
) -> list[Manifest]:
    """What the operator creates for `pools`: `laneway render`, the operator's own code,
    refusing what the operator's `flags` (access_flags) refuse."""
    result = subprocess.run(
        laneway_argv("render", "-", "--image", f"simulator={image}", *(flags or [])),
        input=yaml.safe_dump_all(pools),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def operator_image(objects: list[Manifest]) -> str:
    env = container(deployment(objects, "operator"))["env"]
    image: str = next(e["value"] for e in env if e["name"] == "LANEWAY_IMAGE")
    return image
