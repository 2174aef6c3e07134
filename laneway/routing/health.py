"""Endpoint health: eject after consecutive failures, re-admit after a passing /health probe.

Pure transitions on a frozen `Health`; the gateway's registry stores them and
`gateway/pools/scrape.py` probes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Health:
    failures: int = 0  # consecutive upstream failures
    ejected: bool = False


def after_failure(health: Health, failures_to_eject: int) -> Health:
    failures = health.failures + 1
    return Health(failures=failures, ejected=health.ejected or failures >= failures_to_eject)


def after_success(health: Health) -> Health:
    # A success on a live request resets the count; only a probe re-admits an ejected one.
    return Health(failures=0, ejected=health.ejected)


def after_probe(health: Health, passed: bool) -> Health:
    return Health(failures=0, ejected=False) if passed else health
