"""The chaos run's schedule and accounting (pure): the windows, which failure was in flight on a
killed process and which one the system should not have had, the batch's files against its
input, what is still held at the end, and the report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from laneway.bench.chaos.options import (
    BEFORE,
    CHAT,
    ENGINE,
    ENGINE_GONE_CODES,
    GATEWAY,
    IN_FLIGHT,
    OK,
    UNEXPECTED,
    WINDOWS,
)
from laneway.stats import percentile


def window_starts(duration_s: float) -> dict[str, float]:
    """Five equal windows; each fault strikes at the start of its own."""
    return {name: duration_s * index / len(WINDOWS) for index, name in enumerate(WINDOWS)}


def window_of(started_s: float, starts: Mapping[str, float]) -> str:
    current = BEFORE
    for name in WINDOWS:
        if started_s >= starts[name]:
            current = name
    return current


@dataclass(frozen=True)
class FaultEvent:
    fault: str  # ENGINE, REDIS or GATEWAY
    target: str  # which process: an engine ("documents-1"), "redis-server", a replica
    killed_at_s: float
    back_at_s: float  # when it was serving again
    pool: str | None = None  # a killed engine's pool


@dataclass(frozen=True)
class ChaosRecord:
    """One client request as the client saw it; seconds since the load began."""

    kind: str  # CHAT or DOCUMENT
    replica: str  # the replica that answered (or failed): "a" or "b"
    pool: str | None  # x-laneway-pool of the answer
    failed_over: bool  # the first replica refused the connection
    started_s: float
    ended_s: float
    status: int  # 0: no HTTP answer
    error: str | None
    error_code: str | None
    ttft_s: float | None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def failure_verdict(record: ChaosRecord, faults: Sequence[FaultEvent]) -> str:
    """OK, UNEXPECTED, or "in flight on killed engine|gateway": it was on that process
    when the process was killed."""
    if record.ok:
        return OK
    for fault in faults:
        spanned = record.started_s <= fault.killed_at_s <= record.ended_s
        if not spanned:
            continue
        if fault.fault == GATEWAY and record.replica == fault.target and record.status in (0, 200):
            # The connection dropped: no answer at all, or a stream cut before its end.
            return f"{IN_FLIGHT} {GATEWAY}"
        if (
            fault.fault == ENGINE
            and record.pool == fault.pool
            and record.error_code in ENGINE_GONE_CODES
        ):
            return f"{IN_FLIGHT} {ENGINE}"
    return UNEXPECTED


def failure_reason(record: ChaosRecord) -> str:
    if record.status == 0:
        return f"no answer: {record.error}"
    code = record.error_code or "-"
    return f"{record.status} {code}"


@dataclass(frozen=True)
class WindowRow:
    window: str
    sent: int
    ok: int
    in_flight_on_killed: int
    unexpected: int
    failed_over: int
    chat_ttft_p50_s: float | None
    chat_ttft_p99_s: float | None


@dataclass(frozen=True)
class FailureGroup:
    window: str
    kind: str
    verdict: str  # "in flight on killed engine|gateway" or UNEXPECTED
    reason: str
    count: int


def window_rows(
    records: Sequence[ChaosRecord], faults: Sequence[FaultEvent], starts: Mapping[str, float]
) -> tuple[WindowRow, ...]:
    rows = []
    for name in WINDOWS:
        mine = [r for r in records if window_of(r.started_s, starts) == name]
        verdicts = Counter(failure_verdict(r, faults) for r in mine)
        ttft = [r.ttft_s for r in mine if r.kind == CHAT and r.ok and r.ttft_s is not None]
        rows.append(
            WindowRow(
                window=name,
                sent=len(mine),
                ok=verdicts[OK],
                in_flight_on_killed=sum(n for v, n in verdicts.items() if v.startswith(IN_FLIGHT)),
                unexpected=verdicts[UNEXPECTED],
                failed_over=sum(r.failed_over for r in mine),
                chat_ttft_p50_s=percentile(ttft, 50) if ttft else None,
                chat_ttft_p99_s=percentile(ttft, 99) if ttft else None,
            )
        )
    return tuple(rows)


def failure_groups(
    records: Sequence[ChaosRecord], faults: Sequence[FaultEvent], starts: Mapping[str, float]
) -> tuple[FailureGroup, ...]:
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for record in records:
        verdict = failure_verdict(record, faults)
        if verdict != OK:
            window = window_of(record.started_s, starts)
            counts[(window, record.kind, verdict, failure_reason(record))] += 1
    order = {name: index for index, name in enumerate(WINDOWS)}
    return tuple(
        FailureGroup(window=window, kind=kind, verdict=verdict, reason=reason, count=count)
        for (window, kind, verdict, reason), count in sorted(
            counts.items(), key=lambda item: (order[item[0][0]], item[0][1:])
        )
    )


@dataclass(frozen=True)
class BatchCheck:
    """The batch's output and error files against its input."""

    items: int
    status: str  # the batch's last status
    completed: int  # custom_ids in the output file
    failed: int  # custom_ids in the error file
    lost: int  # input custom_ids in neither file
    duplicated: int  # custom_ids written more than once, across both files
    unknown: int  # custom_ids in the files that the input never had
    errors: dict[str, int]  # error file: code -> count
    finished_at_s: float | None  # since the load began; None: not finished within --settle


def check_batch(
    expected: Sequence[str],
    output_ids: Sequence[str],
    error_ids: Sequence[str],
    error_codes: Sequence[str],
    status: str,
    finished_at_s: float | None,
) -> BatchCheck:
    seen = Counter([*output_ids, *error_ids])
    wanted = set(expected)
    return BatchCheck(
        items=len(expected),
        status=status,
        completed=len(output_ids),
        failed=len(error_ids),
        lost=sum(1 for custom_id in wanted if seen[custom_id] == 0),
        duplicated=sum(count - 1 for count in seen.values() if count > 1),
        unknown=sum(1 for custom_id in seen if custom_id not in wanted),
        errors=dict(Counter(error_codes)),
        finished_at_s=finished_at_s,
    )


def error_line_code(line: Mapping[str, Any]) -> str:
    """Why an error-file line failed: the item's error code (a line the gateway could not
    run), else the code of the error answer it got, else that answer's status."""
    error = line.get("error")
    if isinstance(error, Mapping) and error.get("code"):
        return str(error["code"])
    response = line.get("response")
    if not isinstance(response, Mapping):
        return "-"
    body = response.get("body")
    answer = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(answer, Mapping) and answer.get("code"):
        return str(answer["code"])
    return str(response.get("status_code", "-"))


@dataclass(frozen=True)
class HeldAtEnd:
    """What is still held once the load and the batch are over: all zero when nothing leaks."""

    gateway: dict[str, dict[str, float]]  # replica -> gauge -> value
    shared: dict[str, bool]  # replica -> its state is shared through Redis again (redis_up)
    redis_load: dict[str, int]  # shared endpoint load fields that are not zero
    redis_pending: int  # batch entries claimed and never acknowledged
    engines: dict[str, int]  # engine -> requests running or waiting in it
    settled_after_s: float  # how long after the load it took to reach this

    @property
    def total(self) -> float:
        return (
            sum(sum(gauges.values()) for gauges in self.gateway.values())
            + sum(abs(value) for value in self.redis_load.values())
            + self.redis_pending
            + sum(self.engines.values())
        )


@dataclass(frozen=True)
class ChaosReport:
    command: str
    machine: str
    options: dict[str, Any]
    faults: tuple[FaultEvent, ...]
    windows: tuple[WindowRow, ...]
    failures: tuple[FailureGroup, ...]
    batch: BatchCheck
    held: HeldAtEnd
    goal_met: bool = field(init=False)

    def __post_init__(self) -> None:
        unexpected = sum(row.unexpected for row in self.windows)
        met = (
            unexpected == 0
            and self.batch.lost == 0
            and self.batch.duplicated == 0
            and self.batch.unknown == 0
            and self.batch.failed == 0
            and self.held.total == 0
            and all(self.held.shared.values())
        )
        object.__setattr__(self, "goal_met", met)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
