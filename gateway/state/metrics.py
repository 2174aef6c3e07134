"""The state layer's Prometheus metrics, on the gateway's registry beside its own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class StateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "laneway_gateway_tenant_refusals",
            "Requests refused for their tenant: unauthenticated (401), or over the tenant's "
            "requests or tokens per minute (429)",
            ("tenant", "reason"),
            registry=registry,
        )
        self.batch_items = Counter(
            "laneway_gateway_batch_items",
            "Batch items this replica settled, by outcome (completed, failed, skipped, expired)",
            ("outcome",),
            registry=registry,
        )
        self.batch_running = Gauge(
            "laneway_gateway_batch_items_running",
            "Batch items this replica is running in the batch lane now",
            registry=registry,
        )
        self.redis_up = Gauge(
            "laneway_gateway_redis_up",
            "1 while shared state in Redis is reachable, 0 while this replica runs on local state",
            registry=registry,
        )

    def watch_redis(self, shared: Callable[[], bool]) -> None:
        self.redis_up.set_function(lambda: 1.0 if shared() else 0.0)
