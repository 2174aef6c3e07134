"""The trace test's runner side: one request trace through the ledger as the virtual runner
drives it, and the same decisions from a second shell that sees only the trace's events."""

from __future__ import annotations

import dataclasses
import random

from laneway.api import Lane
from laneway.ledger import NO_BLOCKS, Admission, Admitted, Finished, Ledger, Queued, Sent, Wakes
from laneway.ledger.recording import Decision, RecordingLedger
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.simulator.elastic import Arrival, TraceWorkload
from laneway.simulator.profiles import PROFILES
from laneway.simulator.runner import COMPLETIONS_PATH, VirtualCluster, ledger_settings
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import PUBLIC_MODEL, SEED_PICKING, SimPool
from laneway.simulator.trace import run_trace
from laneway.tokens import TokenBounds

H200 = PROFILES["h200-llama3-8b"]
# Two requests at a time per replica, so the trace has requests waiting in the line.
ENGINE = SchedulerConfig(
    kind="chunked", token_budget=2048, chunk_size=1024, max_num_seqs=2, max_context=8192
)
POOLS = [
    SimPool(
        name="chat",
        lane=Lane.INTERACTIVE,
        max_prompt_tokens=None,
        max_context_tokens=8192,
        replicas=2,
        engine=ENGINE,
    )
]
ARRIVALS = [Arrival(at_s=0.01 * i, prompt_tokens=300 + 97 * i, output_tokens=30) for i in range(12)]


def test_the_runner_drives_every_request_through_the_ledger() -> None:
    ledger, cluster = run_trace(POOLS, ARRIVALS, H200, SEED_PICKING)
    calls: dict[int, list[str]] = {}
    for step in ledger.steps:
        calls.setdefault(step.ticket, []).append(step.call)
    life = ["admit", "plan", "sent", "first_token", "finished"]
    assert calls == {ticket: life for ticket in range(1, 13)}
    admits = [s.answer for s in ledger.steps if s.call == "admit"]
    assert sum(isinstance(a, Queued) for a in admits) == 8  # four slots, twelve at once
    sent = {s.ticket: s.answer.endpoint.url for s in ledger.steps if isinstance(s.answer, Sent)}
    logs = {s.ticket: s.answer.log for s in ledger.steps if isinstance(s.answer, Finished)}
    assert cluster.logs == list(logs.values())
    assert all(log.endpoint == sent[ticket] for ticket, log in logs.items())
    assert {log.attempts for log in logs.values()} == {1}
    assert len(cluster.logs) == 12
    assert {log.status for log in cluster.logs} == {200}
    assert not cluster.requests


def _replay(recorded: RecordingLedger, *, first_tokens: bool = True) -> list[Decision]:
    """A second shell: it hears only the trace's events (arrivals, first tokens, ends, at
    their times) and does what a gateway does with the ledger's answers. Without
    `first_tokens` it tells the ledger of none."""
    ledger = RecordingLedger(ledger_settings(SEED_PICKING, None), random.Random("trace"))
    ledger.update_pools(0.0, recorded.pools())
    arrivals = iter(ARRIVALS)

    def send(ticket: int, now: float) -> None:
        plan = ledger.plan(ticket, now, NO_BLOCKS)
        ledger.sent(ticket, now, plan.endpoints[0])

    def wake(wakes: Wakes, now: float) -> None:
        for admitted in wakes.granted:
            send(admitted.ticket, now)

    for step in recorded.steps:
        if step.call == "admit":
            arrival = next(arrivals)
            tokens = TokenBounds(arrival.prompt_tokens, arrival.prompt_tokens)
            route = classify(RouteRequest(PUBLIC_MODEL, tokens, arrival.output_tokens),
                             ledger.pools())  # fmt: skip
            assert isinstance(route, Route)
            ask = Admission(
                route=route,
                arrived=step.at,
                path=COMPLETIONS_PATH,
                model=PUBLIC_MODEL,
                stream=True,
                fair_tokens=route.prefill_tokens,
            )
            decision = ledger.admit(step.at, ask)
            if isinstance(decision, Admitted):
                send(decision.ticket, step.at)
        elif step.call == "first_token" and first_tokens:
            ledger.first_token(step.ticket, read_at=step.at, written_at=step.at)
        elif step.call == "finished":
            prompt = ARRIVALS[step.ticket - 1].prompt_tokens
            finished = ledger.finished(step.ticket, step.at, status=200, prompt_tokens=prompt)
            wake(finished.wakes, step.at)
    return ledger.decisions()


def test_a_second_shell_fed_the_same_trace_gets_the_same_decisions() -> None:
    recorded, _ = run_trace(POOLS, ARRIVALS, H200, SEED_PICKING)
    assert _replay(recorded) == recorded.decisions()
    # The comparison can fail: a shell that leaves out a step of the bookkeeping (here the
    # first token, which releases the prompt's prefill backlog) plans differently.
    assert _replay(recorded, first_tokens=False) != recorded.decisions()


def test_a_full_line_is_the_gateways_429_and_the_workload_hears_none() -> None:
    burst = [Arrival(at_s=0.0, prompt_tokens=500, output_tokens=30) for _ in range(12)]
    workload = TraceWorkload(burst)
    settings = dataclasses.replace(ledger_settings(SEED_PICKING, None), max_waiting=2)
    cluster = VirtualCluster(
        POOLS,
        H200,
        SEED_PICKING,
        workload,
        duration_s=0.0,
        tie_break="trace",
        scrape_interval_s=None,
        ledger=Ledger(settings, random.Random("trace")),
    )
    cluster.run()
    # Two replicas of two slots, two places in line: the other six are refused at once.
    assert workload.unrouted == 6
    assert [(log.status, log.error) for log in cluster.logs[:6]] == [(429, "queue_full")] * 6
    assert [log.status for log in cluster.logs[6:]] == [200] * 6
