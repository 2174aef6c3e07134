"""The `priority` a request carries to its engine: set by the gateway, never by the client.

The gateway's level follows vLLM's direction, lower first: the tenant's own `priority`
(its tenants entry, default 0) plus one for the batch queue class, so within a tenant
interactive work goes first. A client may ask for a later place (a larger value) for its
own request, never an earlier one: a smaller value is raised to the gateway's level.

Each engine reads the number its own way:
- vLLM handles lower values first ("The priority of the request (lower means earlier
  handling; default: 0)", `priority` in `vllm/entrypoints/openai/protocol.py`), and refuses
  a non-zero priority unless `--scheduling-policy priority`.
- SGLang handles higher values first unless `--schedule-low-priority-values-first`
  (`schedule_low_priority_values_first: bool = False` in
  `python/sglang/srt/server_args.py`). The operator renders that flag for every SGLang pool
  it runs with `scheduling.policy: priority`, so those take the level as it is; pods it
  adopts (`selector`) run their own flags, SGLang's default is assumed and the level is
  negated.

A pool that does not schedule by priority gets no `priority` at all (vLLM would refuse a
non-zero one with a 400).
"""

from __future__ import annotations

from laneway.api import EngineKind, InferencePool, Lane, SchedulingPolicy

BATCH_OFFSET = 1  # a batch request's level behind the same tenant's interactive ones


def gateway_level(tenant_priority: int, lane: Lane, asked: int | None) -> int:
    """The request's level, lower first: the tenant's and lane's, or a later one it asked."""
    level = tenant_priority + (BATCH_OFFSET if lane is Lane.BATCH else 0)
    return level if asked is None else max(level, asked)


def engine_priority(pool: InferencePool, level: int) -> int | None:
    """The `priority` to send `pool`'s engine for `level`; None: send none."""
    spec = pool.spec
    if spec.scheduling.policy is not SchedulingPolicy.PRIORITY:
        return None
    higher_first = spec.engine.kind is EngineKind.SGLANG and spec.selector is not None
    return -level if higher_first else level
