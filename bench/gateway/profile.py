"""`laneway bench gateway --against ... --profile DIR`: where laneway's CPU goes, by function.

While laneway's rounds are measured, py-spy samples the gateway process (without pausing
it: `--nonblocking`; idle samples, the loop waiting in epoll, are left out as py-spy leaves
them by default). Its collapsed stacks are written to DIR, one file per mode, for any flame
graph tool; the summary here gives each function's share of the samples, inclusive (the
stacks it is on) and own (the stacks it ends), and that share of the CPU milliseconds per
request the same rounds measured. py-spy runs on another CPU than the gateway; reading the
gateway's memory still costs the gateway a little, so a profiled run's CPU figure is not
the one to compare.

The summary is pure; `Sampler` is the shell around py-spy.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from laneway.errors import UsageError
from laneway.tables import format_table

RATE_HZ = 250
TOP_FRAMES = 30
STOP_TIMEOUT_S = 30.0
_LINE_NUMBER = re.compile(r":\d+\)$")


@dataclass(frozen=True)
class FrameShare:
    frame: str  # "function (file)": every line of a function counted as one
    inclusive: float  # share of the samples whose stack holds it
    own: float  # share of the samples whose stack ends in it


@dataclass(frozen=True)
class Profile:
    mode: str
    samples: int
    cpu_ms_per_request: float | None
    frames: tuple[FrameShare, ...]  # the most inclusive first
    path: str  # the collapsed stacks


def frame_name(frame: str) -> str:
    """py-spy's `function (path:line)` as `function (path)`."""
    return _LINE_NUMBER.sub(")", frame.strip())


def summarize(
    collapsed: str, mode: str, cpu_ms_per_request: float | None, path: str, top: int = TOP_FRAMES
) -> Profile:
    """The `top` most inclusive functions of py-spy's collapsed stacks (`a;b;c COUNT`)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(frame) for frame in stack.split(";") if frame.strip()]
        if not frames:
            continue
        samples += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    shares = tuple(
        FrameShare(frame=frame, inclusive=hits / samples, own=own[frame] / samples)
        for frame, hits in inclusive.most_common(top)
    )
    return Profile(
        mode=mode, samples=samples, cpu_ms_per_request=cpu_ms_per_request, frames=shares, path=path
    )


def render_profiles(profiles: tuple[Profile, ...]) -> list[str]:
    lines: list[str] = []
    for profile in profiles:
        cpu = profile.cpu_ms_per_request
        header = ("function (file)", "inclusive", "own", "inclusive ms/req", "own ms/req")
        rows = [
            (
                frame.frame,
                f"{frame.inclusive:.1%}",
                f"{frame.own:.1%}",
                "-" if cpu is None else f"{frame.inclusive * cpu:.4f}",
                "-" if cpu is None else f"{frame.own * cpu:.4f}",
            )
            for frame in profile.frames
        ]
        lines += [
            "",
            f"laneway's profile, {profile.mode}: {profile.samples} samples at {RATE_HZ} Hz, "
            f"the stacks in {profile.path}",
            *format_table(header, rows),
        ]
    return lines


class Sampler:
    """py-spy recording one process into a collapsed-stacks file until `stop`."""

    def __init__(self, py_spy: Path, pid: int, output: Path) -> None:
        self.output = output
        argv = [
            str(py_spy), "record", "--pid", str(pid), "--rate", str(RATE_HZ),
            "--format", "raw", "--nonblocking", "--output", str(output),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def stop(self) -> str:
        """Stop sampling (py-spy writes its file on SIGINT); the collapsed stacks."""
        self._process.send_signal(signal.SIGINT)
        try:
            _, errors = self._process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            raise UsageError("py-spy did not stop within 30 s of its SIGINT") from None
        if not self.output.exists():
            raise UsageError(f"py-spy wrote no profile: {errors.decode(errors='replace')[-500:]}")
        return self.output.read_text()
