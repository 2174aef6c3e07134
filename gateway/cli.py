"""Command-line entry point of the gateway: `laneway gateway`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laneway.errors import UsageError, cannot_listen
from laneway.gateway.state.settings import (
    BATCH_CONCURRENCY,
    BATCH_LEASE_S,
    FILE_TTL_S,
    MAX_FILE_BYTES,
    REDIS_URL_ENV,
    TENANT_BATCH_TOKENS,
    TENANT_FILE_BYTES,
    TENANT_FILES,
    TENANTS_ENV,
)

if TYPE_CHECKING:
    from laneway.gateway.config import GatewaySettings
    from laneway.gateway.pools.sources import PoolSource

# Where Kubernetes mounts a pod's own namespace with its service account token.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Objects alive beyond the last collection that start the next one (settle_heap says why).
YOUNG_COLLECTION_THRESHOLD = 10_000


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `gateway`."""
    gateway = commands.add_parser(
        "gateway",
        help="serve the OpenAI API and route each request to its lane's pool",
        description="The lane router: OpenAI-compatible API, plus /healthz, /readyz and "
        "/metrics on the same port (/metrics on a port of its own with --metrics-port). Pools "
        "come from --config (InferencePool documents with status.endpoints) or from the "
        "Kubernetes API with --kubernetes.",
    )
    add_pool_flags(gateway)
    gateway.add_argument(
        "--host",
        help="address to bind (default 0.0.0.0 with --tenants, else 127.0.0.1: without API "
        "keys every caller is anonymous, so only this machine may call)",
    )
    gateway.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="let a gateway without --tenants listen beyond loopback: only behind your own "
        "authentication (the chart's gateway.auth.enabled=false)",
    )
    gateway.add_argument(
        "--port",
        type=int,
        default=8080,
        help="port to listen on; 0 picks a free one (default 8080)",
    )
    gateway.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics on this port instead, and answer 404 there on the API port: the "
        "metrics name engines and tenants (default: on the API port)",
    )
    add_redis_flag(gateway)
    add_state_flags(gateway)
    gateway.set_defaults(handler=run_gateway)


def add_pool_flags(parser: argparse.ArgumentParser) -> None:
    """Where the pools come from: --config, or the cluster with --kubernetes (`laneway
    gateway` and `laneway epp` alike; pool_source reads them)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="multi-document YAML: InferencePools and at most one GatewayConfig",
    )
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="watch InferencePools and their endpoints in the cluster (--config may then "
        "hold only the GatewayConfig)",
    )
    parser.add_argument(
        "--namespace",
        help="with --kubernetes: the one namespace to watch (default: the pod's own, read from "
        f"{POD_NAMESPACE_FILE}; every namespace when that file does not exist, i.e. outside "
        "a pod)",
    )
    parser.add_argument(
        "--all-namespaces",
        action="store_true",
        help="with --kubernetes: watch every namespace, even in a pod (needs the cluster-wide "
        "role of manifests/rbac/gateway.yaml)",
    )


def run_gateway(args: argparse.Namespace) -> int:
    from laneway.gateway.access_log import OffLoopLogging
    from laneway.gateway.app import create_app
    from laneway.gateway.state.shared import options_from_args

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    host = bind_address(
        args.host,
        authenticated=args.tenants is not None,
        allow_unauthenticated=args.allow_unauthenticated,
    )
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise UsageError(f"--metrics-port must be between 0 and 65535, got {args.metrics_port}")
        if args.metrics_port == args.port != 0:
            raise UsageError(
                f"--metrics-port {args.metrics_port} is the API port: give another one, or "
                "leave it out to serve /metrics on the API port"
            )
    shared = options_from_args(args)
    settings, source = pool_source(args, "gateway", purpose="route to")
    # Written by a thread: a stderr nobody drains must not block the event loop.
    logs = OffLoopLogging(sys.stderr)
    try:
        app = create_app(settings, source, shared=shared, metrics_route=args.metrics_port is None)
        settle_heap()
        drain_seconds = settings.drain_timeout_millis / 1000
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(serve(app, host, args.port, drain_seconds, args.metrics_port))
    finally:
        logs.close()


def pool_source(
    args: argparse.Namespace, command: str, *, purpose: str
) -> tuple[GatewaySettings, PoolSource]:
    """The settings and the pools add_pool_flags asked for; UsageError naming the flag.
    `command` names the one running in its log line, `purpose` what it does with pools."""
    from laneway.gateway.config import GatewaySettings, load_config
    from laneway.gateway.pools.sources import StaticPoolSource

    for flag, given in (
        ("--namespace", args.namespace is not None),
        ("--all-namespaces", args.all_namespaces),
    ):
        if given and not args.kubernetes:
            raise UsageError(f"{flag} needs --kubernetes")
    if args.config is None and not args.kubernetes:
        raise UsageError("give --config FILE with the pools, or --kubernetes to watch them")
    loaded = load_config(args.config, allow_pools=not args.kubernetes) if args.config else None
    settings = loaded.settings if loaded else GatewaySettings()
    if args.kubernetes:
        from laneway.gateway.pools.discovery import KubernetesPoolSource

        namespace = watched_namespace(args)
        where = f"namespace {namespace}" if namespace else "every namespace"
        print(f"laneway {command}: watching InferencePools in {where}", file=sys.stderr, flush=True)
        return settings, KubernetesPoolSource(namespace=namespace)
    assert loaded is not None
    if not loaded.pools:
        raise UsageError(f"{args.config}: holds no InferencePool document to {purpose}")
    return settings, StaticPoolSource(loaded.pools)


def settle_heap() -> None:
    """What startup built (modules, the tokenizer, the app) lives as long as the process:
    collected once, then kept out of the collector's sight. Otherwise every full collection
    walks those tens of thousands of objects again, holding the event loop (and every stream
    on it) while it does, where after this it walks only what requests left behind.

    And the youngest generation is collected once YOUNG_COLLECTION_THRESHOLD more objects
    are alive than at the last collection, not 700 (CPython's default): a request's objects
    die with it by reference counting, but 64 requests in flight hold a few thousand at
    once, so at 700 a collection would run every twenty requests, walking live requests that
    it cannot free."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it installs (not on Windows): its transports cost less per write."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def watched_namespace(args: argparse.Namespace, pod_file: Path = POD_NAMESPACE_FILE) -> str | None:
    """--namespace, else the pod's own namespace, else None: every namespace."""
    if args.namespace is not None and args.all_namespaces:
        raise UsageError("give --namespace NS or --all-namespaces, not both")
    if args.all_namespaces:
        return None
    if args.namespace is not None:
        if not args.namespace:
            raise UsageError("--namespace must not be empty (--all-namespaces watches every one)")
        return str(args.namespace)
    try:
        namespace = pod_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None  # not in a pod (or no service account mounted): the kubeconfig's cluster
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(
            f"cannot read the pod's namespace from {pod_file}: {error}; "
            "give --namespace NS or --all-namespaces"
        ) from None
    if not namespace:
        raise UsageError(f"{pod_file} is empty; give --namespace NS or --all-namespaces")
    return namespace


async def serve(
    app: Any, host: str, port: int, drain_seconds: float, metrics_port: int | None = None
) -> int:
    """Serve until SIGTERM, SIGINT or a fatal failure, then drain open streams; exit code."""
    from aiohttp import web

    from laneway.gateway.app import create_metrics_app
    from laneway.gateway.keys import SETTINGS, STOP
    from laneway.gateway.serving.protocol import listen
    from laneway.gateway.state.shared import announce_listening

    # Each connection's settings, for the runner and for the protocol `listen` serves with.
    connections: dict[str, Any] = {
        "access_log": None,  # the gateway logs one structured line per request itself
        # aiohttp closes a connection that sends no whole request head this long after it
        # connects or after its last answer: idle keep-alive and slow headers alike.
        "keepalive_timeout": app[SETTINGS].clients.idle_timeout_millis / 1000,
    }
    runner = web.AppRunner(
        app,
        handle_signals=False,
        handler_cancellation=True,  # a client that disconnects cancels its upstream call
        shutdown_timeout=drain_seconds,
        **connections,
    )
    await runner.setup()
    try:
        # Not a TCPSite: the listener's protocol notes when each request's bytes arrive.
        listener = await listen(runner, host, port, connections)
    except OSError as error:
        await runner.cleanup()
        raise cannot_listen(host, port, error) from None
    bound_port = listener.sockets[0].getsockname()[1]
    metrics_runner = None
    if metrics_port is not None:
        metrics_runner = web.AppRunner(create_metrics_app(app), handle_signals=False)
        await metrics_runner.setup()
        try:
            await web.TCPSite(metrics_runner, host, metrics_port).start()
        except OSError as error:
            listener.close()
            await metrics_runner.cleanup()
            await runner.cleanup()
            raise cannot_listen(host, metrics_port, error, "--metrics-port") from None
        bound_metrics = metrics_runner.addresses[0][1]
        print(f"laneway gateway: metrics on http://{host}:{bound_metrics}/metrics", flush=True)
    announce_listening(app, host, bound_port)
    print(f"laneway gateway: listening on http://{host}:{bound_port}", flush=True)
    stop = app[STOP]
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.requested.set)
    await stop.requested.wait()
    if stop.failure is not None:
        print(f"laneway gateway: error: {stop.failure}", file=sys.stderr, flush=True)
    print(f"laneway gateway: draining for up to {drain_seconds:g} s", file=sys.stderr, flush=True)
    listener.close()  # no new connections; runner.cleanup() drains the open ones
    await runner.cleanup()
    if metrics_runner is not None:
        await metrics_runner.cleanup()  # last: the drain is worth watching
    return 0 if stop.failure is None else 1


def bind_address(host: str | None, *, authenticated: bool, allow_unauthenticated: bool) -> str:
    """Where to listen: anywhere only with API keys, or when told the keys are elsewhere."""
    if host is None:
        return "0.0.0.0" if authenticated else "127.0.0.1"
    if authenticated or allow_unauthenticated or _loopback(host):
        return host
    raise UsageError(
        f"--host {host} without --tenants would serve anyone who reaches it, unauthenticated: "
        "give --tenants (API keys), bind 127.0.0.1, or pass --allow-unauthenticated when "
        "your own authentication sits in front"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, which may resolve to any address


def add_state_flags(parser: argparse.ArgumentParser) -> None:
    """The state layer's flags on `laneway gateway` (beside --redis-url, declared there)."""
    add_tenants_flag(parser)
    parser.add_argument(
        "--batch-concurrency",
        type=int,
        default=BATCH_CONCURRENCY,
        metavar="N",
        help="batch items this replica runs in the batch lane at once "
        f"(default {BATCH_CONCURRENCY})",
    )
    parser.add_argument(
        "--batch-lease",
        type=float,
        default=BATCH_LEASE_S,
        metavar="SECONDS",
        help="silence after which another replica takes over a replica's batch items "
        f"(default {BATCH_LEASE_S:g})",
    )
    parser.add_argument(
        "--max-file-bytes",
        type=int,
        default=MAX_FILE_BYTES,
        metavar="BYTES",
        help=f"largest batch input file accepted (default {MAX_FILE_BYTES})",
    )
    parser.add_argument(
        "--tenant-files",
        type=int,
        default=TENANT_FILES,
        metavar="N",
        help="files a tenant may keep at once, unless its tenants entry sets maxFiles "
        f"(default {TENANT_FILES})",
    )
    parser.add_argument(
        "--tenant-file-bytes",
        type=int,
        default=TENANT_FILE_BYTES,
        metavar="BYTES",
        help="bytes of files a tenant may keep at once, unless its tenants entry sets "
        f"maxFileBytes (default {TENANT_FILE_BYTES})",
    )
    parser.add_argument(
        "--tenant-batch-tokens",
        type=int,
        default=TENANT_BATCH_TOKENS,
        metavar="N",
        help="estimated tokens of a tenant's batch items not yet run, unless its tenants "
        f"entry sets maxBatchTokens (default {TENANT_BATCH_TOKENS})",
    )
    add_tenant_cap_flags(parser)
    parser.add_argument(
        "--file-ttl",
        type=int,
        default=FILE_TTL_S,
        metavar="SECONDS",
        help=f"files expire this long after they are made (default {FILE_TTL_S}, 30 days)",
    )


def add_redis_flag(parser: argparse.ArgumentParser) -> None:
    """--redis-url: `laneway gateway`'s and `laneway epp`'s, shared between their replicas."""
    parser.add_argument(
        "--redis-url",
        default=os.environ.get(REDIS_URL_ENV),
        help=f"shared state for several replicas (default ${REDIS_URL_ENV}; password from "
        "$LANEWAY_REDIS_PASSWORD)",
    )


def add_tenants_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenants",
        metavar="PATH",
        default=os.environ.get(TENANTS_ENV),
        help="API keys and limits per tenant: a YAML file, or a directory such as a mounted "
        f"Secret; turns auth on (default ${TENANTS_ENV}; unset: no auth)",
    )


def add_tenant_cap_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant-max-concurrent",
        type=int,
        default=None,
        metavar="N",
        help="requests a tenant may run in one pool at once, over every replica, unless its "
        "tenants entry sets maxConcurrentRequests (default: no cap)",
    )
    parser.add_argument(
        "--tenant-max-queued",
        type=int,
        default=None,
        metavar="N",
        help="requests a tenant may have waiting in one pool's line, over every replica, "
        "unless its tenants entry sets maxQueuedRequests (default: no cap)",
    )
    parser.add_argument(
        "--tenant-max-concurrent-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="prompt tokens of a tenant's requests running in one pool at once, over every "
        "replica, unless its tenants entry sets maxConcurrentPromptTokens; a request that "
        "would pass it waits in line, one longer than it runs alone (default: no cap)",
    )
