"""`laneway gateway --metrics-port`: /metrics on a port of its own, 404 on the API port.

The metrics name engines and tenants, so the chart serves them apart from the public API
where a NetworkPolicy can admit only Prometheus. A real gateway in front of `laneway sim`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml
from support.launch import start_gateway, start_sim
from support.pools import pool_doc

from laneway.bench.harness.procs import Children, laneway_argv
from laneway.bench.harness.redis_server import free_port
from laneway.cli import main

# A pool to route to; tests that never route point it at port 9 (discard).
POOL = pool_doc("solo", "interactive", "m", ["http://127.0.0.1:9"], routing={"models": ["m"]})


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def solo_requests(metrics_port: int) -> list[str]:
    status, body = get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert status == 200
    return [
        line
        for line in body.decode().splitlines()
        if line.startswith("laneway_gateway_requests_total{") and 'pool="solo"' in line
    ]


def test_metrics_move_to_their_own_port_and_count_the_api_traffic(tmp_path: Path) -> None:
    metrics_port = free_port()
    (tmp_path / "tenants.yaml").write_text(
        yaml.safe_dump({"tenants": [{"name": "acme", "apiKeys": ["sk-acme"]}]})
    )
    with Children() as children:
        engine = start_sim(children, "m")
        gateway = start_gateway(
            children,
            tmp_path / "gateway.yaml",
            [{**POOL, "status": {"endpoints": [engine.url]}}],
            *("--metrics-port", str(metrics_port), "--tenants", str(tmp_path / "tenants.yaml")),
        )
        status, body = get(f"{gateway.url}/metrics")
        assert status == 404
        assert json.loads(body)["error"]["code"] == "not_found"
        assert get(f"{gateway.url}/healthz")[0] == 200

        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-acme", max_retries=0)
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=2
        )
        # The request is counted when it ends, which may be just after the client has it.
        deadline = time.monotonic() + 60
        while not (counted := solo_requests(metrics_port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counted, get(f"http://127.0.0.1:{metrics_port}/metrics")[1].decode()
        assert get(f"http://127.0.0.1:{metrics_port}/v1/models")[0] == 404
        assert children.crashed() == []


def test_the_metrics_port_must_differ_from_the_api_port(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("")
    assert (
        main(["gateway", "--config", str(config), "--port", "8080", "--metrics-port", "8080"]) == 2
    )
    assert "--metrics-port 8080 is the API port" in capsys.readouterr().err


def test_a_taken_metrics_port_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(POOL))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            laneway_argv(
                "gateway",
                *("--config", str(tmp_path / "gateway.yaml"), "--host", "127.0.0.1"),
                *("--port", "0", "--metrics-port", str(port)),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "pick another with --metrics-port" in result.stderr
    assert "Traceback" not in result.stderr
