"""What a pool may reach besides its own engine: the Secrets its engine env reads, and the
pods its `selector` adopts.

Whoever may create an InferencePool writes the engine's pod spec through it. Unchecked, an
`engine.env` entry with `valueFrom.secretKeyRef` would hand any Secret of the namespace (the
gateway's API keys, the Redis password) to a process the pool's author chooses the flags of,
and a `selector` would put any pod (Redis, say) behind a Service the gateway routes to and a
PodDisruptionBudget. So the operator lets env read only the Secrets its administrator lists,
and adopts only pods that opted in by a label: laneway's own pool label naming this pool,
or `laneway.io/adoptable: "true"`. The API has no `envFrom` or volumes for engines, so env
is the only way a pool names a Secret.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laneway.api import GROUP, POOL_LABEL, InferencePool

# The label a pod carries to say any pool of its namespace may adopt it.
ADOPTABLE_LABEL = f"{GROUP}/adoptable"
ADOPTABLE_VALUE = "true"


@dataclass(frozen=True)
class Refusal:
    """Why the operator will not run a pool as written: a condition reason and a message
    that says what to change."""

    reason: str
    message: str
    # The pool's running children must go, not only stay as they were: they reach what the
    # pool may not (a Service selecting foreign pods keeps routing to them).
    withdraw: bool = False


def secret_refusal(pool: InferencePool, allowed: Sequence[str]) -> Refusal | None:
    """The first env entry that reads a Secret outside `allowed`, or None."""
    for index, variable in enumerate(pool.spec.engine.env):
        secret = _secret_read(variable)
        if secret is None or secret in allowed:
            continue
        where = f"spec.engine.env[{index}] ({variable['name']})"
        named = f"Secret {secret!r}" if secret else "a Secret it does not name"
        offered = (
            f"the Secrets it allows are {', '.join(allowed)}; use one of those"
            if allowed
            else "it allows none; remove valueFrom.secretKeyRef"
        )
        return Refusal(
            reason="SecretNotAllowed",
            message=f"{where} reads {named}, which this operator does not give engines: "
            f"{offered}, or have the operator's administrator allow it "
            "(--allowed-env-secret, the chart's operator.allowedEnvSecrets)",
        )
    return None


def _secret_read(variable: Mapping[str, object]) -> str | None:
    """The Secret an EnvVar reads ("" when it names none), or None when it reads none."""
    source = variable.get("valueFrom")
    if not isinstance(source, Mapping) or "secretKeyRef" not in source:
        return None
    reference = source["secretKeyRef"]
    name = reference.get("name") if isinstance(reference, Mapping) else None
    return name if isinstance(name, str) else ""


def selector_refusal(pool: InferencePool) -> Refusal | None:
    """Why the pool's selector could adopt pods that never asked for it, or None."""
    labels = pool.spec.selector
    if labels is None:
        return None
    if labels.get(POOL_LABEL) == pool.name or labels.get(ADOPTABLE_LABEL) == ADOPTABLE_VALUE:
        return None
    written = ", ".join(f"{key}={value}" for key, value in sorted(labels.items()))
    return Refusal(
        reason="SelectorNotAllowed",
        message=f"spec.selector ({written}) could adopt pods that never opted in, such as "
        f"another workload's: add {POOL_LABEL}: {pool.name} (or {ADOPTABLE_LABEL}: "
        f'"{ADOPTABLE_VALUE}") to spec.selector.matchLabels and to the engine pods\' labels',
        withdraw=True,
    )
