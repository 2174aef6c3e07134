"""Progress of one virtual-time run on stderr: a line per configuration, redrawn in place on
a terminal, a line a quarter elsewhere (CI logs), then its wall time."""

from __future__ import annotations

import sys


class VirtualProgress:
    def __init__(self, bench: str, name: str, duration_s: float) -> None:
        self._label = f"{bench}: {name:<16}"
        self._duration_s = duration_s
        self._tty = sys.stderr.isatty()
        self._last_quarter = -1

    def __call__(self, simulated_s: float) -> None:
        share = min(simulated_s / self._duration_s, 1.0)
        line = f"{self._label} {share:4.0%} ({simulated_s:5.1f} s simulated)"
        if self._tty:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
        elif int(share * 4) > self._last_quarter:
            self._last_quarter = int(share * 4)
            print(line, file=sys.stderr, flush=True)

    def done(self, wall_s: float) -> None:
        end = "\n" if self._tty else ""
        print(f"{end}{self._label} done in {wall_s:.1f} s wall", file=sys.stderr)
