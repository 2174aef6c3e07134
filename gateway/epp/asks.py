"""What a request asks of the picker in its headers: laneway's own (`x-laneway-lane`,
`x-laneway-session`) and the Gateway API ecosystem's beside them, in llm-d's `x-llm-d-*`
spelling and the older `x-gateway-*` one.

- objective (`x-llm-d-inference-objective`, `x-gateway-inference-objective`): the name of an
  InferenceObjective. Where it names a laneway lane (`interactive`, `batch`) it pins the
  lane as `x-laneway-lane` does (which wins where both are given); any name's priority
  is looked up in `laneway epp --objectives` (objectives.py).
- fairness id (`x-llm-d-inference-fairness-id`, `x-gateway-inference-fairness-id`): the flow
  an anonymous request's fair share is charged to, or with --trust-fairness-id the tenant
  (`tenancy.py`).
- TTFT and TPOT SLOs (`x-llm-d-slo-ttft-ms`, `x-llm-d-slo-tpot-ms`, and `x-slo-ttft-ms`,
  `x-slo-tpot-ms`): positive milliseconds, checked here; the pool's `slo` stays what
  picking and verdicts are measured against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from laneway.api import Lane
from laneway.gateway.errors import bad_request
from laneway.gateway.serving.incoming import SESSION_HEADER
from laneway.gateway.serving.request_body import LANE_HEADER, parse_lane

OBJECTIVE = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
FAIRNESS_ID = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
TTFT_SLO = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
TPOT_SLO = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
FAIRNESS_ID_CHARS = 256


@dataclass(frozen=True)
class Asks:
    lane: Lane | None  # pinned by x-laneway-lane or a lane-named objective
    objective: str | None  # the InferenceObjective named (objectives.py: its priority)
    fairness_id: str  # "" where none is sent (tenancy.py says what it names)
    session_key: str | None
    ttft_slo_ms: float | None
    tpot_slo_ms: float | None


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = headers.get(name, "").strip()
        if value:
            return name, value
    return None


def _millis(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    found = _first(headers, names)
    if found is None:
        return None
    name, value = found
    try:
        millis = float(value)
    except ValueError:
        millis = -1.0
    if not millis > 0 or millis == float("inf"):
        raise bad_request(
            f"Header {name} must be a positive number of milliseconds, got {value!r}", name
        )
    return millis


def read_asks(headers: Mapping[str, str]) -> Asks:
    """The request's asks; ApiError 400 naming the header that is malformed."""
    lane = parse_lane(headers.get(LANE_HEADER))
    objective = _first(headers, OBJECTIVE)
    if lane is None and objective is not None:
        try:
            lane = Lane(objective[1].lower())
        except ValueError:
            lane = None  # an objective that names no lane pins none
    fairness = _first(headers, FAIRNESS_ID)
    if fairness is not None and len(fairness[1]) > FAIRNESS_ID_CHARS:
        raise bad_request(
            f"Header {fairness[0]} is longer than {FAIRNESS_ID_CHARS} characters", fairness[0]
        )
    return Asks(
        lane=lane,
        objective=objective[1] if objective else None,
        fairness_id=fairness[1] if fairness else "",
        session_key=headers.get(SESSION_HEADER, "").strip() or None,
        ttft_slo_ms=_millis(headers, TTFT_SLO),
        tpot_slo_ms=_millis(headers, TPOT_SLO),
    )
