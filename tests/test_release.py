"""The release pipeline's parts: .github/workflows linted, and every script it calls run here.

scripts/release.py is run as the workflow runs it, on this repository and on copies with one
thing changed, so each check is seen to fail when it should.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from laneway import __version__

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = ROOT / "scripts" / "release.py"
CHART = Path("charts") / "laneway"
CRD = Path("crds") / "laneway.io_inferencepools.yaml"
# What a copy of the repository needs for every release.py command.
REPO_PARTS = ("pyproject.toml", "CHANGELOG.md", "laneway", "charts", "crds", "manifests", "scripts")
# The release.py commands and scripts the workflows call, each exercised below.
TESTED_COMMANDS = {"version", "upgrade-check", "notes", "package-chart"}
TESTED_SCRIPTS = {"scripts/release.py", "scripts/image-smoke.sh"}


def tool(name: str) -> str:
    """A tool from PATH, .tools/bin (scripts/install-tools.sh) or the venv (the dev extra)."""
    places = (None, str(ROOT / ".tools" / "bin"), str(Path(sys.executable).parent))
    found = next(filter(None, (shutil.which(name, path=place) for place in places)), None)
    if found is None:
        pytest.fail(f"{name} is missing: scripts/install-tools.sh or the dev extra installs it")
    return found


def release(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "release.py"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the parts of the repository a release touches."""
    for part in REPO_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, tmp_path / part)
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} in {path}"
    path.write_text(text.replace(old, new))


def set_unreleased(changelog: Path, entries: str) -> None:
    """The copy's [Unreleased] section holds `entries` alone, whatever the real one holds."""
    text = changelog.read_text()
    start = text.index("## [Unreleased]\n")
    end = text.index("\n## [", start + 1)
    changelog.write_text(text[:start] + "## [Unreleased]\n" + entries + text[end:])


# --- the workflows ----------------------------------------------------------------------


def run_actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck (dev extra) on PATH: actionlint checks every `run:` script with it.
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    return subprocess.run(
        [tool("actionlint"), "-no-color", *map(str, paths)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_actionlint_passes_on_every_workflow() -> None:
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert {w.name for w in workflows} >= {"ci.yml", "release.yml"}
    result = run_actionlint(*workflows)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_shell_mistake_and_a_bad_expression(tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - run: echo ${{ github.nope }}\n      - run: cd $HOME/x && ls $1\n"
    )
    result = run_actionlint(bad)
    assert result.returncode == 1
    assert "nope" in result.stdout
    assert "shellcheck" in result.stdout


def workflow_runs() -> list[str]:
    runs = []
    for path in WORKFLOWS.glob("*.yml"):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            runs += [step["run"] for step in job.get("steps", []) if "run" in step]
    return runs


def test_every_script_the_workflows_call_is_tested_here() -> None:
    text = "\n".join(workflow_runs())
    scripts = set(re.findall(r"scripts/[\w.-]+", text))
    assert scripts == TESTED_SCRIPTS
    commands = set(re.findall(r"scripts/release\.py ([\w-]+)", text))
    assert commands == TESTED_COMMANDS


def test_release_runs_on_version_tags_after_the_tests_and_pushes_multi_arch() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    # PyYAML reads the key `on` as True.
    assert workflow[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+*"]
    jobs = workflow["jobs"]
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
    assert "test" in jobs["image"]["needs"]
    push = next(s for s in jobs["image"]["steps"] if s.get("id") == "push")
    assert push["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert push["with"]["push"] is True
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())
    assert ci["jobs"]["test"]["steps"][-1]["run"] == "bash .ci/run"


# --- one version ------------------------------------------------------------------------


def test_every_place_states_the_packages_version() -> None:
    result = release("version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == __version__


@pytest.mark.parametrize(
    ("path", "old", "new", "named"),
    [
        (CHART / "Chart.yaml", 'appVersion: "{v}"', 'appVersion: "9.9.9"', "appVersion"),
        (CHART / "Chart.yaml", "version: {v}\n", "version: 9.9.9\n", "Chart.yaml version"),
        (CHART / "values.yaml", 'tag: ""', 'tag: "9.9.9"', "image.tag"),
        (CRD, 'version: "{v}"', 'version: "9.9.9"', "crds/laneway.io_inferencepools.yaml label"),
        (Path("laneway/__init__.py"), '"{v}"', '"9.9.9"', "__version__"),
        (Path("CHANGELOG.md"), "## [{v}]", "## [9.9.9]", "CHANGELOG.md newest release"),
        (Path("manifests/examples/batch-sglang.yaml"), "io/v1alpha1", "io/v1", "not served"),
    ],
)
def test_a_place_that_drifts_fails_the_check_by_name(
    repo: Path, path: Path, old: str, new: str, named: str
) -> None:
    edit(repo / path, old.format(v=__version__), new)
    result = release("version", root=repo)
    assert result.returncode == 1
    assert named in result.stderr


def test_a_tag_must_name_the_version(repo: Path) -> None:
    assert release("version", "--tag", f"v{__version__}", root=repo).returncode == 0
    result = release("version", "--tag", "v9.9.9", root=repo)
    assert result.returncode == 1
    assert f"tag v9.9.9 is not v{__version__}" in result.stderr


def test_bump_moves_every_place_and_the_unreleased_entries(repo: Path) -> None:
    set_unreleased(repo / "CHANGELOG.md", "\n### Fixed\n\n- A bug.\n")
    result = release("bump", "0.2.0", "--date", "2027-01-02", root=repo)
    assert result.returncode == 0, result.stderr
    assert release("version", "--tag", "v0.2.0", root=repo).stdout.strip() == "0.2.0"
    changelog = (repo / "CHANGELOG.md").read_text()
    assert "## [Unreleased]\n\n## [0.2.0] - 2027-01-02\n\n### Fixed\n\n- A bug.\n" in changelog
    assert release("notes", "0.2.0", root=repo).stdout.strip() == "### Fixed\n\n- A bug."
    gen = subprocess.run(
        ["bash", str(repo / "scripts" / "gen-manifests.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gen.returncode == 0, gen.stderr
    assert 'app.kubernetes.io/version: "0.2.0"' in (repo / CHART / "crds" / CRD.name).read_text()


def test_bump_refuses_an_empty_unreleased_section(repo: Path) -> None:
    set_unreleased(repo / "CHANGELOG.md", "")
    result = release("bump", "0.2.0", root=repo)
    assert result.returncode == 1
    assert "nothing to release" in result.stderr


# --- release notes ----------------------------------------------------------------------


def test_notes_are_the_changelog_section_of_the_version() -> None:
    result = release("notes", __version__)
    assert result.returncode == 0, result.stderr
    text = (ROOT / "CHANGELOG.md").read_text()
    section = text.split(f"## [{__version__}]")[1].split("\n## ")[0]
    assert result.stdout.strip() == section.split("\n", 1)[1].strip()
    assert "### Added" in result.stdout


def test_notes_of_a_version_without_a_section_fail() -> None:
    result = release("notes", "9.9.9")
    assert result.returncode == 1
    assert "no [9.9.9] section" in result.stderr


# --- the chart package ------------------------------------------------------------------


def test_packaged_chart_installs_the_image_released_with_it(tmp_path: Path) -> None:
    result = release("package-chart", str(tmp_path), "--image-repository", "ghcr.io/acme/laneway")
    assert result.returncode == 0, result.stderr
    package = Path(result.stdout.strip())
    assert package == tmp_path / f"laneway-{__version__}.tgz"
    helm = tool("helm")
    rendered = subprocess.run(
        [helm, "template", "lw", str(package), "--namespace", "serving"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    expected = f"ghcr.io/acme/laneway:{__version__}"
    images = re.findall(r"image: (\S+)", rendered)
    assert images
    assert set(images) == {expected}
    assert f'value: "{expected}"' in rendered, "LANEWAY_IMAGE for the simulator pools"
    crds = subprocess.run(
        [helm, "show", "crds", str(package)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert crds.strip().removeprefix("---").strip() == (ROOT / CRD).read_text().strip()
    with tarfile.open(package) as tar:
        values = yaml.safe_load(tar.extractfile("laneway/values.yaml").read())  # type: ignore[union-attr]
    assert values["image"]["repository"] == "ghcr.io/acme/laneway"
    assert values["image"]["tag"] == "", "the chart's appVersion"


def test_package_chart_refuses_a_registry_name_it_cannot_push(tmp_path: Path) -> None:
    result = release("package-chart", str(tmp_path), "--image-repository", "ghcr.io/Acme/laneway")
    assert result.returncode == 1
    assert "lowercase" in result.stderr


# --- upgrade safety ---------------------------------------------------------------------


def test_upgrade_from_the_committed_chart_is_safe() -> None:
    result = release("upgrade-check", "--from-ref", "HEAD")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("path", "old", "new", "named"),
    [
        (CHART / "values.yaml", "- name: sim-batch", "- name: sim-long", "InferencePool sim-batch"),
        (
            CHART / "templates" / "_helpers.tpl",
            "app.kubernetes.io/instance: {{ .root.Release.Name }}",
            "app.kubernetes.io/instance: {{ .root.Release.Name }}-x",
            "spec.selector changed",
        ),
        (CHART / "crds" / CRD.name, "served: true", "served: false", "stops serving v1alpha1"),
    ],
)
def test_upgrade_check_names_what_helm_upgrade_would_break(
    repo: Path, path: Path, old: str, new: str, named: str
) -> None:
    old_chart = repo / "old"
    shutil.copytree(repo / CHART, old_chart)
    edit(repo / path, old, new)
    result = release("upgrade-check", "--from-dir", str(old_chart), root=repo)
    assert result.returncode == 1
    assert named in result.stderr


def test_upgrade_check_refuses_a_templated_crd(repo: Path) -> None:
    old_chart = repo / "old"
    shutil.copytree(repo / CHART, old_chart)
    (repo / CHART / "crds" / CRD.name).rename(repo / CHART / "templates" / "crd.yaml")
    result = release("upgrade-check", "--from-dir", str(old_chart), root=repo)
    assert result.returncode == 1
    assert "is templated; keep it in crds/" in result.stderr


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        timeout=60,
        check=True,
    )


def test_previous_release_is_the_newest_earlier_tag(repo: Path) -> None:
    git(repo, "init", "-q")
    assert release("upgrade-check", "--previous-release", root=repo).returncode == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release")
    git(repo, "tag", "v0.0.1")
    git(repo, "tag", f"v{__version__}")  # the release being made: not "previous"
    edit(repo / CHART / "values.yaml", "- name: sim-realtime", "- name: sim-chat")
    git(repo, "commit", "-q", "-am", "rename")
    git(repo, "tag", "v0.0.2")
    result = release("upgrade-check", "--previous-release", root=repo)
    assert result.returncode == 0, result.stderr  # v0.0.2 renamed the pool too
    assert "helm upgrade from v0.0.2 keeps every pool" in result.stderr
    git(repo, "tag", "-d", "v0.0.2")
    result = release("upgrade-check", "--previous-release", root=repo)
    assert result.returncode == 1
    assert "helm upgrade from v0.0.1" in result.stderr
    assert "InferencePool sim-realtime is no longer rendered" in result.stderr


@pytest.mark.parametrize("script", ["scripts/image-smoke.sh", "scripts/install-tools.sh"])
def test_release_shell_scripts_pass_shellcheck(script: str) -> None:
    result = subprocess.run(
        [tool("shellcheck"), "--severity=style", str(ROOT / script)],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("repository", "says_load"), [("laneway", True), ("ghcr.io/acme/laneway", False)]
)
def test_notes_say_how_to_get_an_image_that_names_no_registry(
    repository: str, says_load: bool
) -> None:
    result = subprocess.run(
        [
            *(tool("helm"), "install", "lw", str(ROOT / CHART), "--dry-run=client"),
            *("--namespace", "serving", "--set", f"image.repository={repository}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"Image: {repository}:{__version__}" in notes
    assert (f"kind load docker-image {repository}:{__version__}" in notes) is says_load
