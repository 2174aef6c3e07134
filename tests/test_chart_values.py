"""Bad chart values fail `helm template` with a message that says what to change; the
values schema mirrors the gateway's parser; the chart's own files (its copy of the CRD, its
notes, its schema's draft, its kubeVersion) and its README, which lists every value."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from support import ROOT
from support.chart import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    Manifest,
    container,
    deployment,
    gateway_config_documents,
    nested,
    parse_laneway,
    run_helm,
    template,
    values_args,
)
from support.merging import merged

from laneway.gateway.config import GatewaySettings, parse_documents

# --- bad values -------------------------------------------------------------------------

EXAMPLE_POOLS = yaml.safe_load((CHART / "values.yaml").read_text())["examplePools"]["pools"]

BAD_VALUES: list[tuple[str, Manifest, str]] = [
    # (case, values, what the error must say)
    (
        "wrong type",
        nested("gateway.replicaCount", "two"),
        "at '/gateway/replicaCount': got string, want integer",
    ),
    (
        "misspelt key",
        nested("gateway.replicas", 3),
        "at '/gateway': additional properties 'replicas' not allowed",
    ),
    (
        "unknown anti-affinity",
        nested("gateway.podAntiAffinity", "always"),
        "/gateway/podAntiAffinity",
    ),
    ("privileged port", nested("gateway.port", 80), "/gateway/port"),
    ("unknown pull policy", nested("image.pullPolicy", "Sometimes"), "/image/pullPolicy"),
    ("redis url scheme", nested("redis.url", "http://cache:6379"), "does not match pattern"),
    (
        "unknown picking policy",
        nested("gateway.config.picking.policy", "fastest"),
        "/gateway/config/picking/policy",
    ),
    (
        "unknown config field",
        nested("gateway.config.queue.depth", 5),
        "additional properties 'depth' not allowed",
    ),
    (
        "huggingface without path",
        nested("gateway.config.tokenizer.kind", "huggingface"),
        "at '/gateway/config/tokenizer': missing property 'path'",
    ),
    (
        "weight above 100",
        nested("gateway.config.picking.weights.queueDepth", 101),
        "/gateway/config/picking/weights/queueDepth",
    ),
    (
        "bad quantity",
        nested("gateway.resources.requests.cpu", "lots"),
        "/gateway/resources/requests/cpu",
    ),
    (
        "bad duration",
        nested("metrics.serviceMonitor.interval", "often"),
        "/metrics/serviceMonitor/interval",
    ),
    (
        "pool name not a DNS label",
        {"examplePools": {"pools": [{**EXAMPLE_POOLS[0], "name": "Not_A_Label"}]}},
        "/examplePools/pools/0/name",
    ),
    (
        "autoscaling min above max",
        nested("gateway.autoscaling", {"enabled": True, "minReplicas": 5, "maxReplicas": 2}),
        "gateway.autoscaling.minReplicas (5) must not exceed gateway.autoscaling.maxReplicas (2)",
    ),
    (
        "drain longer than grace",
        nested("gateway.terminationGracePeriodSeconds", 20),
        "gateway.preStopSleepSeconds (5 s) plus gateway.config.drainTimeoutMillis (30000) "
        "must be below gateway.terminationGracePeriodSeconds (20 s)",
    ),
    (
        "stale before next scrape",
        nested("gateway.config.scrape.intervalMillis", 9000),
        "gateway.config.scrape.staleAfterMillis (5000) must be >= "
        "gateway.config.scrape.intervalMillis (9000)",
    ),
    (
        "all weights zero",
        nested(
            "gateway.config.picking.weights", dict.fromkeys(GatewaySettings().picking.weights, 0)
        ),
        "at least one scorer with a weight above 0",
    ),
    (
        "bundled and external redis",
        merged(nested("redis.enabled", True), nested("redis.url", "redis://cache:6379")),
        "set either redis.enabled (the bundled Redis) or redis.url (your own), not both",
    ),
    (
        "tenants without auth",
        merged(
            nested("gateway.auth.enabled", False),
            nested("gateway.tenants.existingSecret", "keys"),
        ),
        "gateway.tenants.existingSecret holds API keys, but gateway.auth.enabled is false",
    ),
    (
        "metrics on the API port number",
        nested("gateway.metricsPort", 8080),
        "gateway.metricsPort (8080) must differ from gateway.port",
    ),
    (
        "engine namespaces without watching them",
        nested("networkPolicy.engineNamespaces", ["inference"]),
        "networkPolicy.engineNamespaces guards engines in other namespaces",
    ),
    (
        "two replicas without Redis",
        nested("gateway.replicaCount", 2),
        "gateway.replicaCount (2) needs shared state: set redis.enabled=true",
    ),
    (
        "autoscaling without Redis",
        nested("gateway.autoscaling.enabled", True),
        "gateway.autoscaling.maxReplicas (10) needs shared state",
    ),
    (
        "a largest file above the quota",
        merged(
            nested("redis.enabled", True),
            nested("gateway.batch.maxFileBytes", 104857600),
        ),
        "gateway.batch.maxFileBytes (104857600) exceeds gateway.batch.tenantFileBytes (67108864)",
    ),
    (
        "redis maxmemory without a unit",
        nested("redis.maxMemory", "200"),
        "/redis/maxMemory",
    ),
    (
        "env secret that is no Secret name",
        nested("operator.allowedEnvSecrets", ["HF Token"]),
        "/operator/allowedEnvSecrets/0",
    ),
    (
        "image prefix with a tag",
        nested("operator.allowedImagePrefixes", ["vllm/vllm-openai:v0.11.0"]),
        "/operator/allowedImagePrefixes/0",
    ),
    (
        "kv events over ipc",
        nested("gateway.config.picking.prefix.kvEvents", [{"pool": "chat", "bind": "ipc:///kv"}]),
        "at '/gateway/config/picking/prefix/kvEvents/0/bind': 'ipc:///kv' does not match pattern",
    ),
    (
        "kv events without a bind",
        nested("gateway.config.picking.prefix.kvEvents", [{"pool": "chat"}]),
        "at '/gateway/config/picking/prefix/kvEvents/0': missing property 'bind'",
    ),
    (
        "kv events on a privileged port",
        nested("gateway.config.picking.prefix.kvEvents", [{"pool": "chat", "bind": "tcp://*:80"}]),
        "gateway.config.picking.prefix.kvEvents: pool chat binds port 80; use 1024-65535",
    ),
    (
        "kv events on the metrics port",
        nested(
            "gateway.config.picking.prefix.kvEvents", [{"pool": "chat", "bind": "tcp://*:9090"}]
        ),
        "pool chat binds port 9090, which gateway.port or gateway.metricsPort already uses",
    ),
    (
        "kv events port bound twice",
        nested(
            "gateway.config.picking.prefix.kvEvents",
            [{"pool": "chat", "bind": "tcp://*:5557"}, {"pool": "docs", "bind": "tcp://*:5557"}],
        ),
        "gateway.config.picking.prefix.kvEvents: port 5557 is bound twice",
    ),
    (
        "kv events pool listed twice",
        nested(
            "gateway.config.picking.prefix.kvEvents",
            [{"pool": "chat", "bind": "tcp://*:5557"}, {"pool": "chat", "bind": "tcp://*:5558"}],
        ),
        "gateway.config.picking.prefix.kvEvents: pool chat is listed twice",
    ),
    (
        "duplicate pool names",
        {"examplePools": {"pools": [EXAMPLE_POOLS[0], EXAMPLE_POOLS[0]]}},
        'examplePools.pools: the name "sim-realtime" is used twice',
    ),
]


@pytest.mark.parametrize(
    ("values", "message"), [case[1:] for case in BAD_VALUES], ids=[case[0] for case in BAD_VALUES]
)
def test_bad_values_fail_with_a_readable_message(
    helm: str, tmp_path: Path, values: Manifest, message: str
) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "-f", str(values_file))
    assert result.returncode != 0, f"helm accepted {values}"
    assert message in result.stderr, result.stderr
    assert "panic" not in result.stderr


def test_schema_rules_mirror_the_gateway_parser(helm: str) -> None:
    """A value the schema lets through must be one the gateway accepts, and vice versa."""
    accepted = template(
        helm,
        "--set",
        "gateway.config.picking.policy=random",
        "--set",
        "gateway.config.scrape.intervalMillis=50",
        "--set",
        "gateway.config.scrape.staleAfterMillis=50",
        "--set",
        "gateway.config.maxBodyBytes=1024",
        "--set",
        "gateway.config.clients.idleTimeoutMillis=100",
        "--set",
        "gateway.config.clients.writeTimeoutMillis=5000",
        "--set",
        "gateway.config.tokenizer.kind=huggingface",
        "--set",
        "gateway.config.tokenizer.path=/tokenizer/tokenizer.json",
        "--set",
        "gateway.config.tokenizer.configPath=/tokenizer/tokenizer_config.json",
    )
    settings = parse_documents(gateway_config_documents(accepted), "cm", allow_pools=False).settings
    assert settings.picking.policy == "random"
    assert settings.scrape.interval_millis == settings.scrape.stale_after_millis == 50
    assert settings.max_body_bytes == 1024
    assert settings.clients.idle_timeout_millis == 100
    assert settings.clients.write_timeout_millis == 5000
    assert settings.tokenizer.config_path == "/tokenizer/tokenizer_config.json"
    for value, where in (
        ("gateway.config.maxBodyBytes=1023", "/gateway/config/maxBodyBytes"),
        (
            "gateway.config.clients.bodyTimeoutMillis=99",
            "/gateway/config/clients/bodyTimeoutMillis",
        ),
        # A chat template is read only beside a Hugging Face tokenizer, as the gateway says.
        ("gateway.config.tokenizer.configPath=/t.json", "/gateway/config/tokenizer"),
    ):
        rejected = run_helm(helm, "template", RELEASE, str(CHART), "--set", value)
        assert rejected.returncode != 0, value
        assert where in rejected.stderr, rejected.stderr


def test_tenant_caps_become_the_gateways_defaults_for_every_tenant(helm: str) -> None:
    objects = template(
        helm,
        "--set",
        "gateway.tenants.maxConcurrentRequests=4",
        "--set",
        "gateway.tenants.maxQueuedRequests=16",
        "--set",
        "gateway.tenants.maxConcurrentPromptTokens=16000",
    )
    args = parse_laneway(list(container(deployment(objects, "gateway"))["args"]))
    assert (args.tenant_max_concurrent, args.tenant_max_queued) == (4, 16)
    assert args.tenant_max_concurrent_prompt_tokens == 16000
    default = parse_laneway(list(container(deployment(template(helm), "gateway"))["args"]))
    assert (default.tenant_max_concurrent, default.tenant_max_queued) == (None, None)
    assert default.tenant_max_concurrent_prompt_tokens is None
    for value in ("maxQueuedRequests=0", "maxConcurrentPromptTokens=0"):
        rejected = run_helm(
            helm, "template", RELEASE, str(CHART), "--set", f"gateway.tenants.{value}"
        )
        assert rejected.returncode != 0
        field = value.partition("=")[0]
        assert f"/gateway/tenants/{field}" in rejected.stderr, rejected.stderr


# --- the chart's own files ----------------------------------------------------------


def test_chart_crd_is_a_byte_for_byte_copy_of_crds() -> None:
    source = ROOT / "crds" / "laneway.io_inferencepools.yaml"
    copy_in_chart = CHART / "crds" / "laneway.io_inferencepools.yaml"
    assert copy_in_chart.read_bytes() == source.read_bytes(), (
        "charts/laneway/crds/ drifted from crds/: run scripts/gen-manifests.sh"
    )


def test_notes_tell_how_to_call_the_gateway(helm: str) -> None:
    result = run_helm(
        helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} port-forward svc/{RELEASE}-laneway-gateway 8080:80" in notes
    assert "/v1/chat/completions" in notes
    assert "sim-realtime: lane interactive" in notes
    assert "without Redis the gateway runs one replica" in notes
    secret = f"{RELEASE}-laneway-api-key"
    assert (
        f"export LANEWAY_API_KEY=$(kubectl -n {NAMESPACE} get secret {secret} "
        "-o jsonpath='{.data.api-key}' | base64 -d)"
    ) in notes
    assert '-H "authorization: Bearer $LANEWAY_API_KEY"' in notes
    assert "Metrics: GET /metrics on port 9090 of the Service (404 on the API port)" in notes
    assert "NetworkPolicies: only the gateway reaches engine pods in serving" in notes
    opt_out = run_helm(
        helm, "install", RELEASE, str(CHART), "--dry-run=client", *values_args("opt-out")
    )
    assert opt_out.returncode == 0, opt_out.stderr
    notes = opt_out.stdout.split("NOTES:", 1)[1]
    assert 'api_key="unused"' in notes
    assert "API-key auth is off (gateway.auth.enabled=false)" in notes
    assert "NetworkPolicies are off" in notes
    assert "Metrics: GET /metrics on the API port" in notes
    production = run_helm(
        helm, "install", RELEASE, str(CHART), "--dry-run=client", *values_args("production")
    )
    assert production.returncode == 0, production.stderr
    notes = production.stdout.split("NOTES:", 1)[1]
    assert "API-key auth is on (Secret laneway-tenants)" in notes
    assert "engine pods in default, inference" in notes
    assert "watching InferencePools in every namespace" in notes
    assert "without Redis" not in notes


def test_values_schema_is_draft_7_so_helm_3_and_4_both_read_it() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for overlay in [{}, *(yaml.safe_load(path.read_text()) for path in CI_VALUES)]:
        errors = [error.message for error in validator.iter_errors(merged(defaults, overlay))]
        assert errors == [], overlay
    broken = merged(defaults, nested("gateway.replicaCount", "two"))
    assert [e.message for e in validator.iter_errors(broken)] == ["'two' is not of type 'integer'"]


def test_chart_refuses_a_kubernetes_older_than_its_schemas_were_checked_against(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", "1.26.0")
    assert result.returncode != 0
    assert "chart requires kubeVersion: >=1.27.0-0" in result.stderr


# --- documentation ----------------------------------------------------------------------


def leaf_paths(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaf_paths(value, f"{path}.")
        else:
            yield path


def test_readme_lists_every_value_and_no_stale_ones() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    expected = set(leaf_paths(values))
    assert expected - documented == set(), "values missing from charts/laneway/README.md"
    assert documented - expected == set(), "README.md documents values that do not exist"
