"""The image's venv, built by the Dockerfile's own build stage, runs every role read-only.

No container engine runs here, so the build stage's instructions are carried out on this
host: its RUN lines, as written, with Debian's Python 3.11 standing in for the base image's
and /opt/laneway moved to a temporary folder. scripts/image-smoke.sh then runs the gateway,
the operator and the simulator from that venv as user 10001 with every filesystem read-only:
the same script the release workflow runs against the real image (`--image`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.dockerfile import (
    DOCKERFILE,
    context_files,
    image_environment,
    parse_dockerfile,
    stages,
)

from laneway import __version__

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "scripts" / "image-smoke.sh"
# The base image's interpreter is python.org's 3.11 at /usr/local; Debian's is the same minor.
STAND_IN_PYTHON = Path("/usr/bin/python3.11")
VENV = "/opt/laneway"

# The image's stage is built once, by pip from the package index, in the first test's setup:
# on a loaded 2-core machine that takes longer than the suite's 300 s hang guard.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def missing_requirements() -> list[str]:
    missing = [tool for tool in ("unshare", "setpriv", "curl") if shutil.which(tool) is None]
    if not STAND_IN_PYTHON.is_file():
        missing.append(str(STAND_IN_PYTHON))
    return missing


@pytest.fixture(scope="module")
def image_venv() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace, and setpriv to become user 10001")
    if missing := missing_requirements():
        pytest.skip(f"missing {', '.join(missing)}")
    # Not pytest's tmp_path: its parent is private to root, and user 10001 must reach the venv.
    work = Path(tempfile.mkdtemp(prefix="laneway-image-"))
    work.chmod(0o755)
    try:
        yield build_stage(work)
    finally:
        shutil.rmtree(work)


def build_stage(work: Path) -> Path:
    """Carry out the Dockerfile's first stage; return where its /opt/laneway went."""
    venv = work / "opt" / "laneway"
    context = list(context_files())
    cwd = work
    env = {"PATH": os.environ["PATH"], "HOME": str(work)}
    [build, _runtime] = stages(parse_dockerfile(DOCKERFILE.read_text()))
    for instruction in build[1:]:  # after FROM
        arguments = instruction.arguments
        if instruction.keyword == "ENV":
            env.update(pair.partition("=")[::2] for pair in shlex.split(arguments))
        elif instruction.keyword == "WORKDIR":
            cwd = work / arguments.lstrip("/")
            cwd.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            *sources, destination = shlex.split(arguments)
            for source in sources:
                # Docker's rules: a file into a folder ("dir/") keeps its name; a folder's
                # contents go into the destination.
                for relative in (p for p in context if p == source or p.startswith(f"{source}/")):
                    if relative != source:
                        target = cwd / destination / Path(relative).relative_to(source)
                    elif destination.endswith("/"):
                        target = cwd / destination / Path(source).name
                    else:
                        target = cwd / destination
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / relative, target)
        elif instruction.keyword == "RUN":
            command = arguments.replace(VENV, str(venv))
            command = command.replace("python -m venv", f"{STAND_IN_PYTHON} -m venv", 1)
            result = subprocess.run(
                ["sh", "-c", command],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            assert result.returncode == 0, f"RUN {arguments}\n{result.stderr[-3000:]}"
        else:
            pytest.fail(f"the build stage has a {instruction.keyword} this test cannot carry out")
    return venv


def test_every_role_runs_as_10001_on_a_read_only_filesystem(image_venv: Path) -> None:
    result = subprocess.run(
        ["bash", str(SMOKE), "--venv", str(image_venv)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"laneway {__version__}"
    for role in ("sim serves", "gateway routes", "operator serves"):
        assert role in result.stderr


def test_the_image_keeps_no_pip_to_run(image_venv: Path) -> None:
    assert not (image_venv / "bin" / "pip").exists()


def test_smoke_runs_with_the_images_environment() -> None:
    """--venv mode sets the environment the Dockerfile's final stage sets, and no other."""
    environment = image_environment(parse_dockerfile(DOCKERFILE.read_text()))
    text = SMOKE.read_text()
    block = text[text.index("image_env=(") : text.index(")", text.index("image_env=("))]
    smoke = dict(line.strip().strip('"').split("=", 1) for line in block.splitlines()[1:])
    assert smoke.pop("HOME") == "/nonexistent", "useradd --home-dir in the final stage"
    assert smoke.pop("PATH").startswith("$target/bin:")
    assert environment.pop("PATH").startswith(f"{VENV}/bin:")
    assert smoke == environment


def test_smoke_fails_when_a_role_cannot_start(tmp_path: Path) -> None:
    """A laneway whose roles exit at start: the script names the first and exits 1."""
    if os.geteuid() != 0 or missing_requirements():
        pytest.skip("needs root, unshare, setpriv and curl")
    broken = Path(tempfile.mkdtemp(prefix="laneway-broken-"))
    try:
        broken.chmod(0o755)
        (broken / "bin").mkdir()
        laneway = broken / "bin" / "laneway"
        laneway.write_text(
            '#!/bin/sh\nif [ "$1" = --version ]; then echo "laneway 0.0.0"; exit 0; fi\nexit 1\n'
        )
        laneway.chmod(0o755)
        result = subprocess.run(
            ["bash", str(SMOKE), "--venv", str(broken)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        shutil.rmtree(broken)
    assert result.returncode == 1
    # Which one is seen first is a race: all three exit at once.
    assert re.search(r"image-smoke: (sim|gateway|operator) exited", result.stderr), result.stderr
