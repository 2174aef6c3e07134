"""`laneway epp`: the gateway as a Gateway API endpoint picker behind Envoy."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from laneway.errors import UsageError, cannot_listen
from laneway.gateway.cli import (
    add_pool_flags,
    add_redis_flag,
    add_tenant_cap_flags,
    add_tenants_flag,
)
from laneway.gateway.epp.objectives import NO_OBJECTIVES, ObjectivePriorities

if TYPE_CHECKING:
    from aiohttp import web

    from laneway.gateway.config import GatewaySettings
    from laneway.gateway.epp.objectives_watch import WatchedObjectives
    from laneway.gateway.lifecycle import Stop
    from laneway.gateway.pools.sources import PoolSource
    from laneway.gateway.state.shared import SharedStateOptions

DEFAULT_PORT = 9002  # the Gateway API Inference Extension's EPP port
DEFAULT_METRICS_PORT = 9090


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    epp = commands.add_parser(
        "epp",
        help="pick endpoints for Envoy (Gateway API Inference Extension endpoint picker)",
        description="Envoy's ext_proc gRPC service speaking the Endpoint Picker Protocol: "
        "each request's lane and endpoint chosen as `laneway gateway` chooses them, answered "
        "as x-gateway-destination-endpoint. gRPC health (liveness, readiness, the ext_proc "
        "service) on the same port; /metrics, /healthz, /readyz on --metrics-port. Pools "
        "come from --config or from the Kubernetes API with --kubernetes, as for `laneway "
        "gateway`.",
    )
    add_pool_flags(epp)
    epp.add_argument("--host", default="0.0.0.0", help="address to bind")
    epp.add_argument("--port", type=int, default=DEFAULT_PORT, help="gRPC port; 0 picks a free one")
    epp.add_argument(
        "--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
        help="HTTP port of /metrics, /healthz and /readyz; 0 picks a free one",
    )  # fmt: skip
    add_redis_flag(epp)
    add_tenants_flag(epp)
    epp.add_argument(
        "--trust-fairness-id",
        action="store_true",
        help="the fairness id header (x-llm-d-inference-fairness-id, "
        "x-gateway-inference-fairness-id) names the tenant in --tenants, in place of the API "
        "key: only where the Gateway authenticates and sets it (default: the API key names "
        "the tenant, as at `laneway gateway`)",
    )
    add_tenant_cap_flags(epp)
    epp.add_argument(
        "--objectives",
        metavar="FILE",
        help="InferenceObjective documents (inference.networking.x-k8s.io): the priority of "
        "the objective a request names (x-llm-d-inference-objective, "
        "x-gateway-inference-objective), higher earlier, at a priority-scheduled pool",
    )
    epp.add_argument(
        "--watch-objectives",
        action="store_true",
        help="with --kubernetes: the same InferenceObjectives watched in the cluster, in the "
        "namespaces pools are watched in, in place of --objectives (needs list and watch on "
        "inferenceobjectives, as manifests/rbac/gateway.yaml grants)",
    )
    epp.set_defaults(handler=run_epp)


def run_epp(args: argparse.Namespace) -> int:
    from laneway.gateway.cli import event_loop_factory, pool_source, settle_heap

    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if not 0 <= port <= 65535:
            raise UsageError(f"{flag} must be between 0 and 65535, got {port}")
    from laneway.gateway.epp.objectives import load_objectives

    shared = shared_options(args)
    settings, source = pool_source(args, "epp", purpose="pick endpoints in")
    watched = watched_objectives(args)
    objectives: ObjectivePriorities = NO_OBJECTIVES
    if watched is not None:
        objectives = watched
    elif args.objectives:
        objectives = load_objectives(args.objectives)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    app = picker_app(settings, source, shared)
    settle_heap()
    picking = PickerOptions(
        trust_fairness_id=args.trust_fairness_id, objectives=objectives, watched=watched
    )
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve(app, args.host, args.port, args.metrics_port, picking))


def picker_app(
    settings: GatewaySettings, source: PoolSource, shared: SharedStateOptions | None
) -> web.Application:
    """The gateway's app as the picker runs it: no HTTP API of its own (/metrics on a port
    of its own, no Files or Batches API), and lending followed, never led: Envoy holds the
    upstream requests a reclaim would have to close, so the picker adopts the roles a
    leading gateway replica publishes to the shared Redis (and lends nothing without)."""
    from laneway.gateway.app import create_app

    return create_app(
        settings, source, shared=shared, metrics_route=False, batches=False, leads_lending=False
    )


def shared_options(args: argparse.Namespace) -> SharedStateOptions | None:
    """The state layer where --tenants or --redis-url asks for it (tenants, their limits,
    load and tenant counts shared with the other replicas, pickers and gateways alike);
    None: every request anonymous, this replica's counts its own."""
    from laneway.gateway.state.redis_store import redis_settings
    from laneway.gateway.state.shared import SharedStateOptions, tenant_keys_from_args

    if args.trust_fairness_id and not args.tenants:
        raise UsageError("--trust-fairness-id needs --tenants: the tenants the fairness id names")
    tenants = tenant_keys_from_args(args)
    redis = redis_settings(args.redis_url)
    if tenants is None and redis is None:
        return None
    return SharedStateOptions(redis=redis, tenants=tenants)


def _watch_ended(stop: Stop, task: asyncio.Task[None]) -> None:
    # The watch retries the API server's errors itself; one that ends anyway would leave the
    # picker serving objectives that no longer change, so it stops (and is restarted).
    if task.cancelled():
        return
    error = task.exception()
    why = "ended" if error is None else f"failed: {type(error).__name__}: {error}"
    stop.fail(f"the InferenceObjectives watch {why}")


def watched_objectives(args: argparse.Namespace) -> WatchedObjectives | None:
    """The cluster's InferenceObjectives where --watch-objectives asks; UsageError naming
    the flag it needs or clashes with."""
    if not args.watch_objectives:
        return None
    if not args.kubernetes:
        raise UsageError("--watch-objectives needs --kubernetes: the cluster to watch them in")
    if args.objectives:
        raise UsageError("give --objectives FILE or --watch-objectives, not both")
    from laneway.gateway.cli import watched_namespace
    from laneway.gateway.epp.objectives_watch import WatchedObjectives

    return WatchedObjectives(watched_namespace(args))


@dataclass(frozen=True)
class PickerOptions:
    trust_fairness_id: bool = False
    objectives: ObjectivePriorities = NO_OBJECTIVES
    watched: WatchedObjectives | None = None  # its watch runs while the picker serves


async def serve(app: Any, host: str, port: int, metrics_port: int, picking: PickerOptions) -> int:
    """Serve until SIGTERM, SIGINT or a fatal failure; exit code."""
    from aiohttp import web

    from laneway.gateway.app import create_metrics_app, healthz, readyz
    from laneway.gateway.epp.server import follow_readiness, start_grpc
    from laneway.gateway.keys import SETTINGS, STOP

    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()  # the pools, the ledger and their background tasks start
    metrics_app = create_metrics_app(app)
    metrics_app.router.add_get("/healthz", healthz)
    metrics_app.router.add_get("/readyz", readyz)
    metrics_runner = web.AppRunner(metrics_app, handle_signals=False)
    await metrics_runner.setup()
    try:
        await web.TCPSite(metrics_runner, host, metrics_port).start()
    except OSError as error:
        await metrics_runner.cleanup()
        await runner.cleanup()
        raise cannot_listen(host, metrics_port, error, "--metrics-port") from None
    try:
        server, health, bound = await start_grpc(
            app,
            host,
            port,
            trust_fairness_id=picking.trust_fairness_id,
            objectives=picking.objectives,
        )
    except (OSError, RuntimeError) as error:
        await metrics_runner.cleanup()
        await runner.cleanup()
        raise cannot_listen(host, port, OSError(str(error))) from None
    stop = app[STOP]
    tasks = [asyncio.create_task(follow_readiness(app, health))]
    if picking.watched is not None:
        watch = asyncio.create_task(picking.watched.run())
        watch.add_done_callback(lambda task: _watch_ended(stop, task))
        tasks.append(watch)
    bound_metrics = metrics_runner.addresses[0][1]
    print(f"laneway epp: metrics on http://{host}:{bound_metrics}/metrics", flush=True)
    print(f"laneway epp: listening on grpc://{host}:{bound}", flush=True)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, stop.requested.set)
    await stop.requested.wait()
    for signum in signals:
        loop.remove_signal_handler(signum)
    if stop.failure is not None:
        print(f"laneway epp: error: {stop.failure}", file=sys.stderr, flush=True)
    drain_seconds = app[SETTINGS].drain_timeout_millis / 1000
    await health.enter_graceful_shutdown()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await server.stop(drain_seconds)  # open streams get this long to end
    await runner.cleanup()
    await metrics_runner.cleanup()
    return 0 if stop.failure is None else 1
