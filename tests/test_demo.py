"""`laneway demo`: its embedded config is one the gateway accepts, and a short run accounts for
every request, keeps lanes apart, serves an OpenAI client, and leaves no process behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import signal
import socket
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import openai
import pyte
import pytest
import yaml
from support.marks import marked_environment, processes_marked

from laneway.api import Lane, SLOSpec
from laneway.bench.demo.run import (
    DEMO_POOLS,
    DemoOptions,
    LiveView,
    check_options,
    check_port_free,
    config_documents,
    demo_workload,
    render_table,
    screen_rows,
    slo_verdict,
)
from laneway.bench.harness.procs import laneway_argv
from laneway.bench.harness.summary import Distribution, LaneSummary
from laneway.cli import main
from laneway.errors import UsageError
from laneway.gateway.config import parse_documents
from laneway.simulator.seed import PUBLIC_MODEL

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
    assert interactive.max_prompt_tokens is not None
    assert batch.max_prompt_tokens is not None
    assert workload.prompt_tokens[1] + workload.output_tokens[1] <= interactive.max_context_tokens
    assert workload.prompt_tokens[1] <= interactive.max_prompt_tokens
    assert len(workload.long_requests) == DemoOptions().long_documents
    for long in workload.long_requests:
        assert batch.min_prompt_tokens <= long.prompt_tokens <= batch.max_prompt_tokens
        assert long.prompt_tokens + long.output_tokens <= batch.max_context_tokens
        assert long.at_s < workload.duration_s


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"port": 70000}, "--port"),
        ({"duration_s": -1}, "--duration"),
        ({"duration_s": 0}, "--serve"),
        ({"sessions": -1}, "--sessions"),
        ({"sessions": 0, "long_documents": 0}, "nothing to send"),
        ({"time_scale": 0}, "--time-scale"),
        ({"engine": "tgi"}, "--engine"),
        ({"engine": "vllm", "time_scale": 10}, "--time-scale is for simulated engines"),
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


def lane(name: str, ttft_p99_s: float, tbt_p99_s: float, failed: int = 0) -> LaneSummary:
    ttft = Distribution(10, ttft_p99_s / 2, ttft_p99_s, ttft_p99_s)
    tbt = Distribution(100, tbt_p99_s / 2, tbt_p99_s, tbt_p99_s)
    return LaneSummary(name, 10, 10 - failed, failed, 500, ttft, tbt, None, (), ())


@pytest.mark.parametrize(
    ("summaries", "expected"),
    [
        (
            [lane("interactive", 0.042, 0.024), lane("batch", 3.1, 0.028)],
            "verdict: SLOs met: interactive TTFT p99 42 ms <= 300 ms, TBT p99 24 ms <= 30 ms; "
            "batch TBT p99 28 ms <= 30 ms",
        ),
        (
            # A long document's first token waits for its whole prefill: not held to 300 ms.
            [lane("interactive", 0.301, 0.024), lane("batch", 3.1, 0.045)],
            "verdict: SLOs MISSED: interactive TTFT p99 301 ms > 300 ms, TBT p99 24 ms <= 30 ms; "
            "batch TBT p99 45 ms > 30 ms",
        ),
        (
            [lane("interactive", 0.042, 0.024, failed=2)],
            "verdict: SLOs MISSED: interactive TTFT p99 42 ms <= 300 ms, TBT p99 24 ms <= 30 ms, "
            "2 failed",
        ),
        ([], "verdict: no requests finished"),
    ],
    ids=["met", "missed", "failures", "nothing"],
)
def test_the_verdict_holds_each_lane_s_p99s_to_the_slo(
    summaries: list[LaneSummary], expected: str
) -> None:
    assert slo_verdict(summaries, SLOSpec()) == expected


@pytest.mark.parametrize(
    ("lines", "columns", "rows"),
    [
        (["short", ""], 80, 2),  # an empty line still takes a row
        (["x" * 80], 80, 1),  # exactly the width: no wrap
        (["x" * 81], 80, 2),
        (["x" * 100, "y" * 30], 40, 3 + 1),
    ],
)
def test_screen_rows_count_wrapped_lines(lines: list[str], columns: int, rows: int) -> None:
    assert screen_rows(lines, columns) == rows


# -- what a terminal shows --------------------------------------------------------------------


class Terminal:
    """A pseudo-terminal: a program writes to `program`; what it wrote is read as it comes."""

    END = b"<the end of the output>"

    def __init__(self, columns: int, rows: int) -> None:
        self._screen, self.program = pty.openpty()  # (master, slave)
        attributes = termios.tcgetattr(self.program)
        attributes[1] |= termios.OPOST | termios.ONLCR  # "\n" leaves as "\r\n", as on a console
        termios.tcsetattr(self.program, termios.TCSANOW, attributes)
        self.resize(columns, rows)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def resize(self, columns: int, rows: int) -> None:
        fcntl.ioctl(self.program, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

    def _read(self) -> None:
        seen = b""
        while not seen.endswith(self.END):
            try:
                chunk = os.read(self._screen, 65536)
            except OSError:  # EIO: closed before our end marker came (a failed test)
                return
            self._chunks.append(chunk)
            seen = (seen + chunk)[-len(self.END) :]

    def output(self) -> bytes:
        """Everything written so far: an end marker after it, read up to the marker."""
        os.write(self.program, self.END)
        self._reader.join(timeout=60)
        assert not self._reader.is_alive(), "the terminal's output never reached its end"
        os.close(self.program)
        os.close(self._screen)
        return b"".join(self._chunks).removesuffix(self.END)


def shown(output: bytes, columns: int, rows: int) -> list[str]:
    screen = pyte.Screen(columns, rows)
    pyte.ByteStream(screen).feed(output)
    return [line.rstrip() for line in screen.display]


def frame(step: int, width: int) -> list[str]:
    return [f"[frame {step}]", *(f"row {i} " + "=" * width for i in range(4)), "end"]


def test_frames_redraw_in_place_on_a_narrow_terminal_and_after_it_narrows() -> None:
    tty = Terminal(columns=40, rows=30)
    stream = os.fdopen(os.dup(tty.program), "w")
    view = LiveView(stream, refresh_s=1)
    view.show(frame(1, 30), plain=False)  # each row wraps onto two
    view.show(frame(2, 60), plain=False)  # wider: two and three rows
    tty.resize(columns=30, rows=30)
    view.show(frame(3, 10), plain=False)
    stream.close()
    output = tty.output()
    text = [line for line in shown(output, 40, 30) if line]
    # pyte does not reflow on a resize; a terminal that does agrees on what is left.
    assert [line for line in text if line.startswith("[frame")] == ["[frame 3]"]
    assert text[-1] == "end"


def test_a_frame_taller_than_the_terminal_is_appended_every_few_refreshes() -> None:
    tty = Terminal(columns=40, rows=6)
    stream = os.fdopen(os.dup(tty.program), "w")
    view = LiveView(stream, refresh_s=1)
    for step in range(1, 4):
        view.show(frame(step, 30), plain=step == 2)  # 6 rows and the cursor's: 7
    stream.close()
    output = tty.output()
    assert b"\x1b[" not in output  # no cursor moves: plain lines
    assert output.count(b"[frame") == 1
    assert b"[frame 2]" in output


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
            assert f"--scheduler {pool.engine.kind}" in command or pool.engine.kind == "chunked"
            assert f"--max-context {pool.max_context_tokens}" in command


def test_on_a_narrow_terminal_the_run_ends_with_one_table_and_its_verdict(marker: str) -> None:
    """The live frames are redrawn in place and taken away: the report is all that is left."""
    args = ("--port", "0", "--duration", "4", "--sessions", "2", "--long-documents", "1")
    tty = Terminal(columns=48, rows=60)
    demo = subprocess.Popen(
        laneway_argv("demo", *args),
        stdout=tty.program,
        stderr=tty.program,
        env=marked_environment(marker),
    )
    try:
        assert demo.wait(timeout=HANG_S) == 0
    finally:
        demo.kill()
        demo.wait()
    output = tty.output()
    assert b"\x1b[" in output  # frames were drawn in place
    text = [line for line in shown(output, 48, 60) if line]
    assert not [line for line in text if "sending]" in line or "finishing]" in line]
    assert len([line for line in text if line.startswith("lane ")]) == 1  # the table's header
    assert sum("accounted for" in line for line in text) == 1
    report_end = text.index("requests outside their lane: 0")
    assert text[report_end + 1].startswith("verdict: SLOs ")
    assert processes_marked(marker) == []


def test_serve_with_no_workload_serves_at_once(marker: str) -> None:
    with demo_process(marker, "--serve", "--duration", "0") as demo:
        assert demo.stderr is not None
        url = wait_for_line(demo.stderr, "serving on ").split("serving on ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        models = client.models.list()
        assert PUBLIC_MODEL in [model.id for model in models]
        demo.send_signal(signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=HANG_S)
    assert demo.returncode == 0, stderr
    assert "sending" not in stderr
    assert "accounted for" not in stdout
    assert processes_marked(marker) == []
