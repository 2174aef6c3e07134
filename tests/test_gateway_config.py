"""The gateway's config file: a bad file names the file, the document and the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from laneway.errors import UsageError
from laneway.gateway.config import GatewaySettings, load_config
from laneway.simulator.elastic import COLD_START_S, DECISION_INTERVAL_S

POOL = """\
apiVersion: laneway.io/v1alpha1
kind: InferencePool
metadata: {name: realtime}
spec:
  lane: interactive
  model: llama
  engine: {kind: simulator}
  routing: {maxPromptTokens: 2000}
  limits: {maxContextTokens: 4096}
status:
  endpoints: [http://127.0.0.1:9001]
"""

GATEWAY = """\
apiVersion: laneway.io/v1alpha1
kind: GatewayConfig
metadata: {name: gateway}
spec:
  picking: {policy: scored, weights: {queueDepth: 3, kvCacheUsage: 0}}
  scrape: {intervalMillis: 500, staleAfterMillis: 2000}
  health: {failuresToEject: 2, checkIntervalMillis: 300}
  queue: {maxWaiting: 10, timeoutMillis: 750, coldStartTimeoutMillis: 90000, retryAfterSeconds: 2}
  tokenizer: {kind: tiktoken, encoding: cl100k_base}
  upstream: {connectTimeoutMillis: 100, readTimeoutMillis: 5000}
  maxBodyBytes: 65536
  drainTimeoutMillis: 1000
"""


def write(tmp_path: Path, *documents: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text("---\n".join(documents))
    return path


def test_a_full_file_loads_pools_and_settings(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, POOL, GATEWAY))
    assert [p.name for p in loaded.pools] == ["realtime"]
    assert loaded.pools[0].endpoints == ("http://127.0.0.1:9001",)
    settings = loaded.settings
    assert settings.picking.weights["queueDepth"] == 3
    assert settings.picking.weights["kvCacheUsage"] == 0
    assert settings.picking.weights["inFlightRequests"] == 2  # default kept
    assert settings.picking.prefix.block_chars == 256  # default kept
    assert (settings.scrape.interval_millis, settings.scrape.stale_after_millis) == (500, 2000)
    assert settings.health.failures_to_eject == 2
    assert (settings.queue.max_waiting, settings.queue.timeout_millis) == (10, 750)
    # A pool with endpoints waits for a slot; one with none waits for a cold start.
    assert settings.queue.wait_limit_millis(pool_has_endpoints=True) == 750
    assert settings.queue.wait_limit_millis(pool_has_endpoints=False) == 90000
    assert settings.upstream.connect_timeout_millis == 100
    assert (settings.max_body_bytes, settings.drain_timeout_millis) == (65536, 1000)


def test_without_a_gateway_config_the_defaults_apply(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, POOL)).settings == GatewaySettings()


BAD = [
    # (case, documents, text the one-line error must contain)
    (
        "a pool field names file, document index and name, and the field",
        [POOL.replace("maxPromptTokens: 2000", "maxPromptTokens: 9000")],
        "document 0 (InferencePool realtime): spec.routing.maxPromptTokens",
    ),
    (
        "a GatewayConfig field of the wrong type",
        [POOL, GATEWAY.replace("maxWaiting: 10", "maxWaiting: lots")],
        "document 1 (GatewayConfig gateway): spec.queue.maxWaiting: must be an integer",
    ),
    (
        "a misspelt GatewayConfig field",
        [POOL, GATEWAY.replace("timeoutMillis: 750", "timeoutMilis: 750")],
        "spec.queue.timeoutMilis: is not a field; did you mean timeoutMillis?",
    ),
    (
        "an unknown scorer",
        [POOL, GATEWAY.replace("queueDepth: 3", "latency: 3")],
        "spec.picking.weights.latency: is not a field",
    ),
    (
        "staleness shorter than the scrape interval",
        [POOL, GATEWAY.replace("staleAfterMillis: 2000", "staleAfterMillis: 100")],
        "spec.scrape.staleAfterMillis: must be >= 500",
    ),
    (
        "all scorer weights zero",
        [
            POOL,
            GATEWAY.replace(
                "{queueDepth: 3, kvCacheUsage: 0}",
                "{queueDepth: 0, kvCacheUsage: 0, inFlightRequests: 0, prefillTokens: 0, "
                "ttftSlo: 0, prefixAffinity: 0}",
            ),
        ],
        "spec.picking.weights: at least one scorer needs a weight above 0",
    ),
    (
        "a prefix block too small to hash usefully",
        [
            POOL,
            GATEWAY.replace(
                "kvCacheUsage: 0}}", "kvCacheUsage: 0}, prefix: {blockChars: 4, maxBlocks: 8}}"
            ),
        ],
        "spec.picking.prefix.blockChars: must be >= 16, got 4",
    ),
    (
        "the restart switch must be a boolean",
        [
            POOL,
            GATEWAY.replace(
                "kvCacheUsage: 0}}", "kvCacheUsage: 0}, prefix: {forgetOnEngineRestart: sometimes}}"
            ),
        ],
        "spec.picking.prefix.forgetOnEngineRestart: must be true or false",
    ),
    (
        "a KV event source that is not a ZMQ address",
        [
            POOL,
            GATEWAY.replace(
                "kvCacheUsage: 0}}",
                "kvCacheUsage: 0}, prefix: {kvEvents: [{pool: chat, bind: 'http://x:5557'}]}}",
            ),
        ],
        "spec.picking.prefix.kvEvents[0].bind: must be a ZMQ address (tcp:// or ipc://)",
    ),
    (
        "a KV event source without its pool",
        [
            POOL,
            GATEWAY.replace(
                "kvCacheUsage: 0}}",
                "kvCacheUsage: 0}, prefix: {kvEvents: [{bind: 'tcp://127.0.0.1:5557'}]}}",
            ),
        ],
        "spec.picking.prefix.kvEvents[0].pool: is required",
    ),
    (
        "one pool fed twice",
        [
            POOL,
            GATEWAY.replace(
                "kvCacheUsage: 0}}",
                "kvCacheUsage: 0}, prefix: {kvEvents: [{pool: a, bind: 'tcp://127.0.0.1:1'}, "
                "{pool: a, bind: 'tcp://127.0.0.1:2'}]}}",
            ),
        ],
        "spec.picking.prefix.kvEvents: each pool and each bind address may appear once",
    ),
    (
        "huggingface without a path",
        [POOL, GATEWAY.replace("{kind: tiktoken, encoding: cl100k_base}", "{kind: huggingface}")],
        "spec.tokenizer.path: is required",
    ),
    (
        "two GatewayConfigs",
        [POOL, GATEWAY, GATEWAY],
        "document 2 (GatewayConfig gateway): only one GatewayConfig",
    ),
    ("an unknown kind", [POOL.replace("kind: InferencePool", "kind: Pool")], "document 0: kind"),
    ("a document that is not a mapping", ["- a\n- b\n"], "document 0: must be a mapping"),
    ("the same pool twice", [POOL, POOL], "InferencePool default/realtime is defined twice"),
]


@pytest.mark.parametrize(
    ("documents", "expected"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_bad_files_fail_with_one_line_naming_the_field(
    tmp_path: Path, documents: list[str], expected: str
) -> None:
    path = write(tmp_path, *documents)
    with pytest.raises(UsageError) as error:
        load_config(path)
    message = str(error.value)
    assert message.startswith(str(path))
    assert expected in message
    assert "\n" not in message


def test_broken_yaml_and_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(write(tmp_path, "spec: [unclosed\n"))
    with pytest.raises(UsageError, match="cannot read config"):
        load_config(tmp_path / "absent.yaml")


def test_staleness_follows_a_long_scrape_interval(tmp_path: Path) -> None:
    slow = GATEWAY.replace(
        "scrape: {intervalMillis: 500, staleAfterMillis: 2000}", "scrape: {intervalMillis: 4000}"
    )
    assert load_config(write(tmp_path, POOL, slow)).settings.scrape.stale_after_millis == 12000


def test_kubernetes_mode_refuses_pools_in_the_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="pools come from the API"):
        load_config(write(tmp_path, POOL), allow_pools=False)
    assert load_config(write(tmp_path, GATEWAY), allow_pools=False).pools == ()


def test_the_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, POOL.replace("lane: interactive", "lane: fast"))
    result = subprocess.run(
        [sys.executable, "-m", "laneway.cli", "gateway", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "document 0 (InferencePool realtime): spec.lane: must be one of" in result.stderr


@pytest.mark.parametrize(
    ("flags", "watching"),
    [
        # Without --namespace: the pod's own, or every one outside a pod (test_gateway_cli.py).
        ([], "laneway gateway: watching InferencePools in "),
        (
            ["--namespace", "serving"],
            "laneway gateway: watching InferencePools in namespace serving",
        ),
    ],
)
def test_a_pool_source_that_fails_stops_the_gateway_with_one_line(
    tmp_path: Path, flags: list[str], watching: str
) -> None:
    # No cluster to watch: the Kubernetes source fails, and the gateway must not keep
    # serving blind; it exits 1 so that its supervisor restarts it.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    environment["KUBECONFIG"] = str(tmp_path / "absent-kubeconfig")
    result = subprocess.run(
        [sys.executable, "-m", "laneway.cli", "gateway", "--kubernetes", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert result.returncode == 1
    assert watching in result.stderr
    assert "laneway gateway: error: the pool source failed:" in result.stderr
    assert "Traceback" not in result.stderr


def test_by_default_a_pool_at_zero_waits_out_a_cold_start_and_a_demand_interval() -> None:
    # The simulator's cold start is the published figure for an 8B model on vLLM.
    queue = GatewaySettings().queue
    woken_after_s = COLD_START_S + DECISION_INTERVAL_S
    assert queue.wait_limit_millis(pool_has_endpoints=False) / 1000 > woken_after_s
    assert queue.timeout_millis / 1000 < woken_after_s  # why a second timeout exists
