"""README.md's "Run it" from a fresh clone: the two set-up commands, then the OpenAI snippet.

The commands are read from the README itself, so it cannot drift from the code. The clone's
virtualenv installs through the machine's pip cache (PIP_CACHE_DIR is left as it is); the demo
gets a short workload and a free port appended, which argparse lets the later flags decide.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
HANG_S = 240  # only a guard against a hang: a loaded machine may be slow to stop the demo


def run_it_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block under '## Run it'."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Run it", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
# Two installs from the package index and a demo: on a loaded 2-core machine that can take
# longer than the suite's 300 s hang guard, so this test gets a wider one.
@pytest.mark.timeout(1800)
def test_the_readme_works_from_a_fresh_clone(tmp_path: Path) -> None:
    blocks = run_it_blocks()
    shell = [body for language, body in blocks if language == ""]
    snippet = next(body for language, body in blocks if language == "python")
    setup, start = shell[0].strip().splitlines()
    clone = tmp_path / "laneway"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(["bash", "-c", setup], cwd=clone, env=env, check=True, timeout=600)

    port = free_port()
    quick = f" --port {port} --duration 2 --sessions 1 --long-documents 0 --time-scale 4"
    with subprocess.Popen(
        ["bash", "-c", f"exec {start}{quick}"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as demo:  # leaving it closes the pipes, which would warn in a later test otherwise
        try:
            assert demo.stderr is not None
            for line in demo.stderr:
                if "serving on" in line:
                    break
            else:
                raise AssertionError(f"the demo never served: {demo.wait()}")
            subprocess.run(
                [str(clone / ".venv/bin/pip"), "install", "-q", "openai"],
                env=env,
                check=True,
                timeout=600,
            )
            answer = subprocess.run(
                [str(clone / ".venv/bin/python"), "-c", snippet.replace("8080", str(port))],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert answer.returncode == 0, answer.stderr
            lane, _, content = answer.stdout.strip().partition(" ")
            assert lane == "interactive"
            assert content
            demo.send_signal(signal.SIGINT)
            demo.communicate(timeout=HANG_S)
        finally:
            demo.kill()
    assert demo.returncode == 0
