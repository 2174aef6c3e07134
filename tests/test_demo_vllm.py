"""`laneway demo --engine vllm`: the demo's two lanes on real vLLM servers of the tiny model
(laneway.bench.demo.vllm), where the tier is installed; and a clear refusal where not.

Run before the tier's other files (the name sorts first), so its two servers never run
beside the session's (one server is about 5 GB)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.marks import marked_environment, processes_marked

from laneway.bench.harness.procs import laneway_argv
from laneway.bench.harness.vllm_server import installed

# Two cold starts side by side on a small machine, then the run and its drain.
HANG_S = 1400


@pytest.mark.vllm
@pytest.mark.timeout(HANG_S + 100)
def test_the_demo_runs_its_lanes_on_vllm(marker: str) -> None:
    reason = installed()
    if reason is not None:
        pytest.skip(reason)
    args = ["--engine", "vllm", "--port", "0", "--duration", "20", "--sessions", "2",
            "--long-documents", "2"]  # fmt: skip
    with subprocess.Popen(
        laneway_argv("demo", *args),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=marked_environment(marker),
    ) as demo:  # fmt: skip
        try:
            stdout, stderr = demo.communicate(timeout=HANG_S)
        finally:
            demo.kill()
    assert demo.returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    heading = lines[0].split()
    # "laneway demo: N of N requests accounted for"
    assert heading[2] == heading[4], stdout
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert set(rows) == {"interactive", "batch"}, stdout
    assert rows["batch"][1:3] == ["2", "0"], stdout  # both documents done, none failed
    assert int(rows["interactive"][1]) > 0, stdout
    assert rows["interactive"][2] == "0", stdout
    assert "requests outside their lane: 0" in lines
    assert "vLLM servers of a tiny model" in stderr
    assert "vLLM chunked prefill" in stderr
    # The servers, their engine cores and the gateway are gone.
    assert processes_marked(marker) == []


def test_without_vllm_installed_the_demo_says_how_to_install_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-venv"
    ran = subprocess.run(
        laneway_argv("demo", "--engine", "vllm", "--port", "0"),
        capture_output=True, text=True, timeout=120, check=False,
        env={**marked_environment("unused"), "VLLM_VENV": str(missing)},
    )  # fmt: skip
    assert ran.returncode == 2
    assert f"vLLM is not installed in {missing}: scripts/install-vllm.sh" in ran.stderr
    assert ran.stderr.count("\n") == 1
