"""The child-process harness: ready lines, clear failures, and no child outliving its parent."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest

from laneway.bench.harness.procs import Children, laneway_argv
from laneway.cli import build_parser
from laneway.errors import ChildError

READY = "fake engine: serving on "


def python_child(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


def is_gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until_gone(pid: int, patience: float = 15.0) -> bool:
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.05)
    return is_gone(pid)


def test_ready_line_gives_the_url_and_stop_ends_the_child() -> None:
    with Children() as children:
        child = children.start(
            "fake",
            python_child(f"""
                import sys, time
                print("warming up", flush=True)
                print("{READY}http://127.0.0.1:4321", flush=True)
                time.sleep(60)
            """),
            READY,
        )
        assert child.url == "http://127.0.0.1:4321"
        assert children.crashed() == []
    assert child.returncode == -signal.SIGTERM
    assert is_gone(child.pid)


def test_a_child_that_dies_before_ready_is_reported_with_its_stderr() -> None:
    with Children() as children, pytest.raises(ChildError) as raised:
        children.start(
            "broken",
            python_child("""
                import sys
                print("bad flag --frobnicate", file=sys.stderr, flush=True)
                sys.exit(3)
            """),
            READY,
        )
    message = str(raised.value)
    assert message.startswith("broken (")  # its name, then its command line
    assert "import sys" in message
    assert "status 3" in message
    assert "bad flag --frobnicate" in message


def test_a_child_that_never_gets_ready_times_out_and_is_stopped() -> None:
    with Children() as children:
        with pytest.raises(ChildError, match="no ready line") as raised:
            children.start(
                "silent",
                python_child("""
                    import sys, time
                    print("still loading", file=sys.stderr, flush=True)
                    time.sleep(60)
                """),
                READY,
                timeout=1.0,
            )
        assert "still loading" in str(raised.value)
        (child,) = children.running
        assert is_gone(child.pid)


def test_a_child_that_ignores_sigterm_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    with Children(stop_grace=0.5) as children:
        child = children.start(
            "stubborn",
            python_child(f"""
                import signal, subprocess, sys, time
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                open({str(pid_file)!r}, "w").write(str(grandchild.pid))
                print("{READY}http://127.0.0.1:1", flush=True)
                time.sleep(60)
            """),
            READY,
        )
        grandchild_pid = int(pid_file.read_text())
        assert child.stop(grace=0.5) == -signal.SIGKILL
    assert wait_until_gone(grandchild_pid)


def test_output_after_ready_is_drained_so_a_chatty_child_keeps_running() -> None:
    with Children() as children:
        child = children.start(
            "chatty",
            python_child(f"""
                import sys, time
                print("{READY}http://127.0.0.1:2", flush=True)
                for i in range(20000):
                    print("log line", i, "x" * 100, file=sys.stderr)
                    print("out line", i, "y" * 100)
                sys.stderr.flush()
                sys.stdout.flush()
                print("done logging", file=sys.stderr, flush=True)
                time.sleep(60)
            """),
            READY,
        )
        # Several MB went through both pipes; without draining the child would block.
        deadline = time.monotonic() + 120  # patience: a loaded machine drains slowly
        while "done logging" not in child.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "done logging" in child.stderr_tail()
        assert child.returncode is None


def test_tracebacks_the_child_prints_are_counted_on_both_streams() -> None:
    with Children() as children:
        child = children.start(
            "failing",
            python_child(f"""
                import logging, sys, time
                logging.basicConfig()
                print("{READY}http://127.0.0.1:3", flush=True)
                for stream in (sys.stderr, sys.stdout):
                    try:
                        raise ValueError("boom")
                    except ValueError:
                        logging.getLogger().handlers[0].setStream(stream)
                        logging.exception("handling a request failed")
                print("no Traceback (most recent call last): here, mid-line", file=sys.stderr)
                sys.stdout.flush()
                print("done logging", file=sys.stderr, flush=True)
                time.sleep(60)
            """),
            READY,
        )
        deadline = time.monotonic() + 60  # patience: a loaded machine
        while "done logging" not in child.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert child.tracebacks() == 2  # one on each stream; the mid-line mention is no traceback


PARENT_SCRIPT = """
import asyncio, sys
from laneway.bench.harness.procs import Children

READY = {ready!r}
CHILD = {child!r}

async def main() -> None:
    async with Children() as children:
        for name in ("a", "b"):
            child = await asyncio.to_thread(children.start, name, CHILD, READY)
            print("child", child.pid, flush=True)
        print("all ready", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""

CHILD_ARGV = python_child(f"""
    import time
    print("{READY}http://127.0.0.1:3", flush=True)
    time.sleep(60)
""")


def start_parent(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT.format(ready=READY, child=CHILD_ARGV))
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert parent.stdout is not None
    pids: list[int] = []
    for line in parent.stdout:
        if line.startswith("child "):
            pids.append(int(line.split()[1]))
        if line.startswith("all ready"):
            break
    assert len(pids) == 2, "the parent never started its children"
    return parent, pids


def test_ctrl_c_in_the_parent_stops_every_child(tmp_path: Path) -> None:
    parent, pids = start_parent(tmp_path)
    with parent:
        parent.send_signal(signal.SIGINT)
        try:
            assert parent.wait(120) != 0  # KeyboardInterrupt, after the children were stopped
        finally:
            parent.kill()
    assert all(is_gone(pid) for pid in pids)


def test_a_parent_killed_outright_takes_its_children_with_it(tmp_path: Path) -> None:
    parent, pids = start_parent(tmp_path)
    with parent:
        parent.kill()
    assert all(wait_until_gone(pid) for pid in pids)


async def test_async_use_starts_children_concurrently_and_stops_them() -> None:
    async with Children() as children:
        started = await asyncio.gather(
            *(
                asyncio.to_thread(
                    children.start,
                    f"fake-{index}",
                    python_child(f"""
                        import time
                        print("{READY}http://127.0.0.1:{5000 + index}", flush=True)
                        time.sleep(60)
                    """),
                    READY,
                )
                for index in range(3)
            )
        )
        assert sorted(c.url for c in started) == [f"http://127.0.0.1:{5000 + i}" for i in range(3)]
    assert all(is_gone(c.pid) for c in started)


def test_no_start_after_close() -> None:
    children = Children()
    children.close()
    with pytest.raises(ChildError, match="being stopped"):
        children.start("late", CHILD_ARGV, READY)


def test_laneway_argv_runs_the_cli_module_with_this_interpreter() -> None:
    completed = subprocess.run(
        laneway_argv("--version"), capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.startswith("laneway ")


def sim_is_available() -> bool:
    (commands,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return "sim" in commands.choices


@pytest.mark.skipif(not sim_is_available(), reason="laneway sim has not landed yet")
async def test_a_real_simulator_on_port_0_serves_its_ready_url() -> None:
    async with Children() as children:
        sim = await children.start_laneway_async(
            "sim", ["--host", "127.0.0.1", "--port", "0", "--model", "tiny", "--profile", "zero"]
        )
        assert sim.url.startswith("http://127.0.0.1:")
        assert not sim.url.endswith(":0")
        async with aiohttp.ClientSession() as session, session.get(f"{sim.url}/health") as reply:
            assert reply.status == 200
    assert is_gone(sim.pid)


async def test_watch_returns_the_result_or_raises_when_a_child_dies() -> None:
    async with Children() as children:
        children.start(
            "doomed",
            python_child(f"""
                import sys, time
                print("{READY}http://127.0.0.1:6", flush=True)
                time.sleep(0.5)
                print("engine fell over", file=sys.stderr, flush=True)
                sys.exit(7)
            """),
            READY,
        )
        assert await children.watch(asyncio.sleep(0, result="quick"), poll_s=0.05) == "quick"
        never_done = asyncio.Event()
        with pytest.raises(ChildError) as raised:
            await children.watch(never_done.wait(), poll_s=0.05)
        assert "status 7" in str(raised.value)
        assert "engine fell over" in str(raised.value)


def test_cpu_seconds_counts_what_the_child_burned() -> None:
    with Children() as children:
        child = children.start(
            "busy",
            python_child(f"""
                import time
                end = time.process_time() + 0.3
                while time.process_time() < end:
                    pass
                print("{READY}http://127.0.0.1:7", flush=True)
                time.sleep(60)
            """),
            READY,
        )
        first = child.cpu_seconds()
        assert first > 0
        assert child.cpu_seconds() >= first


def test_a_laneway_child_that_fails_names_its_command_as_typed() -> None:
    with Children() as children, pytest.raises(ChildError) as raised:
        children.start_laneway("sim", ["--port", "70000"], name="engine")
    message = str(raised.value)
    assert message.startswith("engine (laneway sim --port 70000) exited with status 2")
    assert "--port must be between 0 and 65535" in message
