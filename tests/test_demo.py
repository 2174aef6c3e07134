"""`laneway demo`: its embedded config is one the gateway accepts, and a short run accounts for
every request, keeps lanes apart, serves an OpenAI client, and leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import openai
import pytest
import yaml
from marked_processes import marked_environment, processes_marked

from laneway.api import Lane
from laneway.bench.demo import (
    DEMO_POOLS,
    PUBLIC_MODEL,
    DemoOptions,
    check_options,
    check_port_free,
    config_documents,
    demo_workload,
    render_table,
)
from laneway.bench.loadgen import LaneSummary
from laneway.bench.procs import laneway_argv
from laneway.cli import main
from laneway.errors import UsageError
from laneway.gateway.config import parse_documents

SHORT_RUN = ["--port", "0", "--time-scale", "10"]
# Only a guard against a hang, under pytest-timeout's 300 s: a loaded machine may take its
# time starting and stopping a dozen processes, and a test must not fail for it.
HANG_S = 240


def test_the_embedded_config_is_one_the_gateway_loads() -> None:
    endpoints = {
        pool.name: [f"http://127.0.0.1:{9000 + i}" for i in range(pool.replicas)]
        for pool in DEMO_POOLS
    }
    loaded = parse_documents(config_documents(endpoints), "demo")
    assert {p.name: p.spec.lane for p in loaded.pools} == {
        "chat": Lane.INTERACTIVE,
        "documents": Lane.BATCH,
    }
    for pool in loaded.pools:
        assert pool.endpoints == tuple(endpoints[pool.name])
        assert pool.spec.public_models == (PUBLIC_MODEL,)
    lanes = {p.spec.lane: p.spec for p in loaded.pools}
    assert lanes[Lane.BATCH].prefill.chunked_prefill
    assert len([p for p in DEMO_POOLS if p.lane is Lane.BATCH]) >= 1
    assert sum(p.replicas for p in DEMO_POOLS if p.lane is Lane.INTERACTIVE) >= 2
    assert sum(p.replicas for p in DEMO_POOLS if p.lane is Lane.BATCH) >= 2


def test_the_workload_sends_chat_to_one_lane_and_documents_to_the_other() -> None:
    workload = demo_workload(DemoOptions())
    interactive = next(p for p in DEMO_POOLS if p.lane is Lane.INTERACTIVE)
    batch = next(p for p in DEMO_POOLS if p.lane is Lane.BATCH)
    assert workload.prompt_tokens[1] + workload.output_tokens[1] <= interactive.max_context
    assert workload.prompt_tokens[1] <= interactive.max_prompt_tokens
    assert len(workload.long_requests) == DemoOptions().long_documents
    for long in workload.long_requests:
        assert batch.min_prompt_tokens <= long.prompt_tokens <= batch.max_prompt_tokens
        assert long.prompt_tokens + long.output_tokens <= batch.max_context
        assert long.at_s < workload.duration_s


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"port": 70000}, "--port"),
        ({"duration_s": 0}, "--duration"),
        ({"sessions": -1}, "--sessions"),
        ({"sessions": 0, "long_documents": 0}, "nothing to send"),
        ({"time_scale": 0}, "--time-scale"),
    ],
)
def test_options_that_cannot_work_name_their_flag(changes: dict[str, float], flag: str) -> None:
    options = DemoOptions(**changes)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=flag):
        check_options(options)


def test_bad_flags_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--time-scale", "-1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "--time-scale" in error


def test_a_taken_port_is_refused_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"127.0.0.1:{port}.*--port"):
            check_port_free("127.0.0.1", port)


def test_the_table_has_a_row_per_lane_and_counts_per_pool() -> None:
    summaries = [
        LaneSummary("interactive", 10, 9, 1, 500, None, None, None, (("chat", 9),), ()),
        LaneSummary("batch", 2, 2, 0, 100, None, None, None, (("documents", 2),), ()),
    ]
    lines = render_table(summaries, {"interactive": 3}, "heading")
    assert lines[0] == "heading"
    assert lines[1].split()[:4] == ["lane", "done", "failed", "running"]
    assert lines[2].split()[:4] == ["interactive", "10", "1", "3"]
    assert lines[3].split()[:4] == ["batch", "2", "0", "0"]
    assert lines[-1] == "requests per pool: chat 9, documents 2"
    only_interactive = render_table(summaries[:1], {"interactive": 1, "batch": 2}, "h")
    assert only_interactive[3].split()[:4] == ["batch", "0", "0", "2"]  # running, none done


# -- whole runs -----------------------------------------------------------------------------


@contextlib.contextmanager
def demo_process(
    mark: str, *args: str, sigint_ignored: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """A running demo; at the end it is killed if still running and its pipes are closed
    (an unclosed pipe's ResourceWarning would fail whichever later test collects it)."""

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell does for a background job

    with subprocess.Popen(
        laneway_argv("demo", *SHORT_RUN, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=marked_environment(mark),
        preexec_fn=ignore_sigint if sigint_ignored else None,
    ) as demo:
        try:
            yield demo
        finally:
            demo.kill()


def wait_for_line(stream: IO[str], fragment: str) -> str:
    for line in stream:
        if fragment in line:
            return line
    raise AssertionError(f"the demo never printed {fragment!r}")


def test_a_short_run_accounts_for_every_request_and_keeps_lanes_apart(marker: str) -> None:
    with demo_process(
        marker, "--duration", "6", "--sessions", "4", "--long-documents", "2"
    ) as demo:
        stdout, stderr = demo.communicate(timeout=HANG_S)
    assert demo.returncode == 0, stderr
    lines = stdout.splitlines()
    heading = lines[0].split()
    # "laneway demo: N of N requests accounted for"
    assert heading[2] == heading[4]
    assert int(heading[2]) > 2
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert set(rows) == {"interactive", "batch"}
    assert rows["batch"][1:3] == ["2", "0"]  # both documents done, none failed
    assert rows["interactive"][2] == "0"
    assert "requests outside their lane: 0" in lines
    pools = next(line for line in lines if line.startswith("requests per pool:"))
    assert "chat" in pools
    assert "documents 2" in pools
    assert "gateway: http://" in stderr
    assert processes_marked(marker) == []


def test_serve_answers_an_openai_client_then_ctrl_c_stops_everything(marker: str) -> None:
    with demo_process(
        marker, "--serve", "--duration", "1", "--sessions", "1", "--long-documents", "0"
    ) as demo:
        assert demo.stderr is not None
        url = wait_for_line(demo.stderr, "serving on ").split("serving on ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model=PUBLIC_MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=5
        )
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 5
        assert len(processes_marked(marker)) >= 1 + sum(p.replicas for p in DEMO_POOLS) + 1
        demo.send_signal(signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=HANG_S)
    assert demo.returncode == 0, stderr
    assert "accounted for" in stdout
    assert processes_marked(marker) == []


@pytest.mark.parametrize(
    ("signum", "sigint_ignored"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["ctrl-c", "kill", "ctrl-c, started with SIGINT ignored"],
)
def test_ctrl_c_or_kill_during_the_workload_stops_every_process(
    marker: str, signum: signal.Signals, sigint_ignored: bool
) -> None:
    with demo_process(
        marker,
        *("--duration", "60", "--sessions", "2", "--long-documents", "1"),
        sigint_ignored=sigint_ignored,
    ) as demo:
        assert demo.stderr is not None
        wait_for_line(demo.stderr, "sending")
        demo.send_signal(signum)
        _, stderr = demo.communicate(timeout=HANG_S)
    assert demo.returncode == 130, stderr
    assert "stopped" in stderr
    assert "Traceback" not in stderr
    assert processes_marked(marker) == []


def test_an_engine_that_dies_mid_run_ends_the_demo_with_its_reason(marker: str) -> None:
    with demo_process(
        marker, "--duration", "60", "--sessions", "2", "--long-documents", "0"
    ) as demo:
        assert demo.stderr is not None
        wait_for_line(demo.stderr, "sending")
        engine = next(
            pid
            for pid in processes_marked(marker)
            if b"\0sim\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
        os.kill(engine, signal.SIGKILL)
        _, stderr = demo.communicate(timeout=HANG_S)
    assert demo.returncode == 1, stderr
    assert f"status {-signal.SIGKILL}" in stderr
    assert processes_marked(marker) == []


def test_the_shipped_local_config_is_the_demos_own() -> None:
    path = Path(__file__).parents[1] / "manifests" / "examples" / "gateway-local.yaml"
    shipped = list(yaml.safe_load_all(path.read_text()))
    endpoints = {doc["metadata"]["name"]: doc["status"]["endpoints"] for doc in shipped}
    assert shipped == config_documents(endpoints)
    # The sim commands in its header start each pool's engines as the demo does.
    header = [line for line in path.read_text().splitlines() if "laneway sim" in line]
    for pool in DEMO_POOLS:
        commands = [line for line in header if f"--model {pool.served_model} " in line]
        assert len(commands) == pool.replicas == len(endpoints[pool.name])
        for command in commands:
            assert f"--scheduler {pool.scheduler}" in command or pool.scheduler == "chunked"
            assert f"--max-context {pool.max_context}" in command
