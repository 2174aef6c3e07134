"""Where `laneway gateway` listens: beyond loopback only with API keys (--tenants) or when told
that authentication sits in front (--allow-unauthenticated, what the chart passes with
gateway.auth.enabled=false). A gateway without keys on 0.0.0.0 served anyone who reached it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.launch import start_gateway
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.procs import Children, laneway_argv
from laneway.errors import UsageError
from laneway.gateway.cli import bind_address

BINDS = [
    # (host given, authenticated, allow_unauthenticated, bound; None: refused, why)
    (None, False, False, "127.0.0.1", "no keys: only this machine by default"),
    (None, True, False, "0.0.0.0", "with keys: every interface, as before"),
    ("127.0.0.1", False, False, "127.0.0.1", "loopback needs no keys"),
    ("::1", False, False, "::1", "IPv6 loopback"),
    ("localhost", False, False, "localhost", "the loopback name"),
    ("0.0.0.0", False, False, None, "everywhere without keys"),
    ("10.0.0.5", False, False, None, "a pod address without keys"),
    ("gateway.example", False, False, None, "a name may resolve anywhere"),
    ("0.0.0.0", True, False, "0.0.0.0", "everywhere with keys"),
    ("0.0.0.0", False, True, "0.0.0.0", "everywhere, authentication in front"),
]


@pytest.mark.parametrize(
    ("host", "authenticated", "allowed", "bound"),
    [c[:4] for c in BINDS],
    ids=[c[4] for c in BINDS],
)
def test_the_bind_address(
    host: str | None, authenticated: bool, allowed: bool, bound: str | None
) -> None:
    if bound is None:
        with pytest.raises(UsageError, match="give --tenants"):
            bind_address(host, authenticated=authenticated, allow_unauthenticated=allowed)
        return
    assert bind_address(host, authenticated=authenticated, allow_unauthenticated=allowed) == bound


def config(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    pool = pool_doc("chat", "interactive", "m", ["http://127.0.0.1:9"])
    path.write_text(yaml.safe_dump_all([pool, gateway_doc()]))
    return path


def test_a_gateway_without_keys_listens_on_loopback_by_default(tmp_path: Path) -> None:
    with Children() as children:
        gateway = children.start_laneway(
            "gateway", ["--config", str(config(tmp_path)), "--port", "0"]
        )
        assert gateway.url.startswith("http://127.0.0.1:")


def test_a_gateway_without_keys_refuses_every_interface(tmp_path: Path) -> None:
    result = subprocess.run(
        laneway_argv("gateway", "--config", str(config(tmp_path)), "--host", "0.0.0.0"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "laneway gateway: error: --host 0.0.0.0 without --tenants would serve anyone"
    )
    assert "--allow-unauthenticated" in result.stderr
    assert "Traceback" not in result.stderr


def test_allow_unauthenticated_listens_everywhere(tmp_path: Path) -> None:
    with Children() as children:
        path = config(tmp_path)
        gateway = start_gateway(
            children,
            path,
            list(yaml.safe_load_all(path.read_text())),
            "--host",
            "0.0.0.0",
            "--allow-unauthenticated",
        )
        # start_gateway puts --host 127.0.0.1 first; the later --host wins.
        assert gateway.url.startswith("http://0.0.0.0:")
