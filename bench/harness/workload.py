"""What a load generator sends: closed-loop chat sessions plus long documents, in model time.

A `Workload` is reproducible from its seed: each session draws from its own random stream
(`session_rng`), seeded and drawn from exactly as the virtual seed experiment does, so a live
run sends the very turns a virtual run of the same seed prices. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from laneway.simulator.seed import SeedScenario


INTERACTIVE = "interactive"
LONG = "long"
# What a request of each kind expects to be routed to, when no gateway says otherwise.
EXPECTED_LANE = {INTERACTIVE: "interactive", LONG: "batch"}


@dataclass(frozen=True)
class LongRequest:
    at_s: float  # model time after the start at which it is sent
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Workload:
    """What to send, in model time; reproducible from `seed`."""

    model: str
    sessions: int = 8  # concurrent closed-loop interactive sessions
    prompt_tokens: tuple[int, int] = (200, 1500)  # inclusive range per interactive turn
    output_tokens: tuple[int, int] = (50, 250)
    think_s: tuple[float, float] = (1.0, 3.0)  # pause between a reply and the next turn
    ramp_s: float = 1.0  # each session starts at a uniformly drawn moment within this
    duration_s: float = 30.0  # no interactive turn starts after this
    max_requests: int | None = None  # a cap on interactive turns, across sessions
    long_requests: tuple[LongRequest, ...] = ()
    # After the duration, in-flight requests (long ones included) get this much longer to
    # finish; then they are cut off and recorded as such.
    drain_s: float = 120.0
    seed: int = 0
    chat_path: str = "/v1/chat/completions"  # interactive turns are chat requests
    long_path: str = "/v1/completions"  # long documents are plain completions
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = _workload_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def long_request_count(self) -> int:
        return len(self.long_requests)


def workload_from_scenario(scenario: SeedScenario, model: str, drain_s: float = 300.0) -> Workload:
    """The seed experiment's workload (laneway.simulator.seed), to replay it live."""
    burst = LongRequest(
        at_s=scenario.burst_at_s,
        prompt_tokens=scenario.long_tokens,
        output_tokens=scenario.long_output_tokens,
    )
    return Workload(
        model=model,
        sessions=scenario.sessions,
        prompt_tokens=scenario.prompt_tokens,
        output_tokens=scenario.output_tokens,
        think_s=scenario.think_time_s,
        ramp_s=scenario.session_start_spread_s,
        duration_s=scenario.duration_s,
        long_requests=(burst,) * scenario.long_requests,
        drain_s=drain_s,
        seed=scenario.seed,
    )


def _workload_problems(workload: Workload) -> list[str]:
    problems = []
    for name in ("prompt_tokens", "output_tokens", "think_s"):
        low, high = getattr(workload, name)
        if low < 0 or high < low:
            problems.append(f"{name} must be a range low <= high with low >= 0, got {low}-{high}")
    if workload.prompt_tokens[0] < 1 or workload.output_tokens[0] < 1:
        problems.append("prompt and output lengths must be at least 1 token")
    if workload.sessions < 0:
        problems.append(f"sessions must be >= 0, got {workload.sessions}")
    if workload.duration_s < 0 or workload.ramp_s < 0 or workload.drain_s < 0:
        problems.append("duration_s, ramp_s and drain_s must be >= 0")
    if workload.max_requests is not None and workload.max_requests < 0:
        problems.append(f"max_requests must be >= 0, got {workload.max_requests}")
    problems.extend(
        f"long request {index}: needs at_s >= 0 and positive token counts"
        for index, long in enumerate(workload.long_requests)
        if long.at_s < 0 or long.prompt_tokens < 1 or long.output_tokens < 1
    )
    return problems


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    output_tokens: int
    think_s: float  # model time to wait after this turn's reply


def draw_turn(rng: random.Random, workload: Workload) -> Turn:
    return Turn(
        prompt_tokens=rng.randint(*workload.prompt_tokens),
        output_tokens=rng.randint(*workload.output_tokens),
        think_s=rng.uniform(*workload.think_s),
    )


def session_rng(seed: int, session: int) -> random.Random:
    """Each session's own stream, so that one session's draws never shift another's.

    Seeded and drawn from exactly as the virtual seed experiment
    (laneway.simulator.seed_experiment) does: the start offset, then per turn the prompt
    length, the output length and the think time. A live run therefore sends the very
    turns a virtual run of the same seed prices.
    """
    return random.Random(f"{seed}/session/{session}")


def text_rng(seed: int, session: int, turn: int) -> random.Random:
    """Prompt wording, drawn apart from the session stream so that it never shifts it."""
    return random.Random(f"{seed}/text/{session}/{turn}")
