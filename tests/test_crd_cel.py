"""Every CEL rule of the CRD, evaluated with cel-python on specs it must pass and specs it
must reject, side by side with laneway.api.check_spec: the API server (stood in for here;
tests/test_cluster_crd.py sends the same table to a real one) and parse_pool must accept
and reject the same specs."""

from __future__ import annotations

from typing import Any

import pytest
from support.crd import admit, apply_defaults, cel_failures, pool_schema, walk
from support.crd_cases import CASES, document

from laneway import api


@pytest.mark.parametrize(("case", "patch", "rule"), CASES, ids=[c[0] for c in CASES])
def test_cel_rules_and_check_spec_agree(case: str, patch: dict[str, Any], rule: str | None) -> None:
    doc = document(patch)
    rejected_by = admit(doc)
    if rule is None:
        assert rejected_by == [], case
        api.parse_pool(doc)
        return
    schema = pool_schema()
    failing_rules = [r for r, _ in cel_failures(schema, apply_defaults(schema, doc))]
    assert len(failing_rules) == 1, failing_rules
    assert rule in failing_rules[0]
    with pytest.raises(api.SpecError) as caught:
        api.parse_pool(doc)
    assert len(caught.value.errors) == 1, caught.value.errors
    # Both name the same field: the CEL rule's fieldPath is the SpecError's path.
    rule_spec = next(
        r
        for _, node in walk(schema)
        for r in node.get("x-kubernetes-validations", ())
        if r["rule"] == failing_rules[0]
    )
    error_path = caught.value.errors[0].path
    assert error_path.endswith(rule_spec["fieldPath"].split(".")[-1]), (error_path, rule_spec)


def test_every_cel_rule_rejects_at_least_one_case() -> None:
    rules = [
        r["rule"]
        for _, node in walk(pool_schema())
        for r in node.get("x-kubernetes-validations", ())
    ]
    exercised = {needle for _, _, needle in CASES if needle}
    for rule in rules:
        assert any(needle in rule for needle in exercised), f"no failing case for {rule}"


def test_cel_messages_say_what_to_change() -> None:
    messages = admit(document({"prefill": {"chunkSize": 4096, "tokenBudget": 2048}}))
    assert messages == [
        "prefill.chunkSize must not exceed prefill.tokenBudget: lower chunkSize or raise "
        "tokenBudget"
    ]
