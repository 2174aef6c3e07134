"""The chart's monitoring: the Grafana dashboard asks only for metrics the gateway really
exports, the burn-rate rules pass `promtool check rules` and their own `promtool test rules`
cases, the gateway's and the simulator's real /metrics pass `promtool check metrics`, and
the KEDA ScaledObjects scale pools on the gateway's demand."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from laneway.api import parse_pool
from laneway.bench.harness.procs import Children
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.gateway.state.shared import SharedStateOptions

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "laneway"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
RULES = CHART / "files" / "prometheus-rules.yaml"
RULES_TESTS = ROOT / "tests" / "prometheus" / "rules-test.yaml"
# A metric name in a PromQL expression; recording rules' names have colons, ours do not.
METRIC = re.compile(r"\b(laneway_[a-z_]+)\b")
SAMPLE_SUFFIXES = ("_bucket", "_total", "_count", "_sum")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: scripts/install-tools.sh installs it")
    return path


def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def template(*values: str) -> list[dict[str, Any]]:
    sets = [arg for value in values for arg in ("--set", value)]
    result = run(tool("helm"), "template", "lw", str(CHART), "--namespace", "ops", *sets)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def family(sample_name: str) -> str:
    for suffix in SAMPLE_SUFFIXES:
        if sample_name.endswith(suffix):
            return sample_name.removesuffix(suffix)
    return sample_name


async def gateway_metric_families() -> set[str]:
    """What a gateway with the state layer installed exports on /metrics."""
    pool = parse_pool(
        {
            "apiVersion": "laneway.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": "chat"},
            "spec": {"lane": "interactive", "model": "m", "engine": {"kind": "simulator"}},
        }
    )
    app = create_app(GatewaySettings(), StaticPoolSource([pool]), shared=SharedStateOptions())
    async with TestClient(TestServer(app)) as client:
        text = await (await client.get("/metrics")).text()
    return {f.name for f in text_string_to_metric_families(text)}


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    variables = dashboard["templating"]["list"]
    queries += [v["definition"] for v in variables if v["type"] == "query"]
    return queries


async def test_every_dashboard_query_names_a_metric_the_gateway_exports() -> None:
    exported = await gateway_metric_families()
    queries = dashboard_queries()
    named = {family(name) for query in queries for name in METRIC.findall(query)}
    assert named, "the dashboard queries no laneway metric"
    assert named <= exported, f"not exported by the gateway: {sorted(named - exported)}"
    for query in queries:
        assert METRIC.search(query), f"a query names no laneway metric: {query}"


def test_the_dashboard_shows_what_an_operator_looks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("ttft", "tbt", "queue", "replicas", "batch backlog", "slo attainment"):
        assert topic in titles, topic
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar() -> None:
    assert not [d for d in template() if d["kind"] == "ConfigMap" and "dashboard" in str(d)]
    (config_map,) = [
        d
        for d in template("metrics.grafanaDashboard.enabled=true")
        if d["metadata"]["name"] == "lw-laneway-dashboard"
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["laneway-lanes.json"]) == json.loads(DASHBOARD.read_text())


def test_the_rules_pass_promtool_as_a_file_and_as_the_charts_prometheusrule(
    tmp_path: Path,
) -> None:
    promtool = tool("promtool")
    checked = run(promtool, "check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (rule,) = [
        d for d in template("metrics.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule"
    ]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    rendered = tmp_path / "rendered-rules.yaml"
    rendered.write_text(yaml.safe_dump(rule["spec"]))
    again = run(promtool, "check", "rules", str(rendered))
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_burn_rate_alerts_fire_when_and_only_when_they_should() -> None:
    tested = run(tool("promtool"), "test", "rules", str(RULES_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


async def test_the_gateways_and_the_simulators_metrics_pass_promtool(tmp_path: Path) -> None:
    promtool = tool("promtool")
    async with Children() as children:
        engine = await children.start_laneway_async(
            "sim", ["--host", "127.0.0.1", "--port", "0", "--model", "m"]
        )
        config = tmp_path / "gateway.yaml"
        pool = {
            "apiVersion": "laneway.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": "chat"},
            "spec": {"lane": "interactive", "model": "m", "engine": {"kind": "simulator"}},
            "status": {"endpoints": [engine.url]},
        }
        config.write_text(yaml.safe_dump(pool))
        gateway = await children.start_laneway_async(
            "gateway", ["--config", str(config), "--host", "127.0.0.1", "--port", "0"]
        )
        # One streamed request, so histograms and labelled counters have samples.
        async with openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0
        ) as api:
            stream = await api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
            assert [chunk async for chunk in stream]
        async with aiohttp.ClientSession() as session:
            texts = {}
            for name, url in (("gateway", gateway.url), ("simulator", engine.url)):
                async with session.get(f"{url}/metrics") as response:
                    texts[name] = await response.text()
    assert "laneway_gateway_ttft_seconds_bucket" in texts["gateway"]
    for name, text in texts.items():
        checked = run(promtool, "check", "metrics", stdin=text)
        problems = [line for line in (checked.stdout + checked.stderr).splitlines() if line]
        # vLLM's own names have colons, and the simulator must export exactly those; one is a
        # histogram named `vllm:iteration_tokens_total` (vllm/v1/metrics/loggers.py).
        engines_own = [
            p
            for p in problems
            if re.match(r"^vllm:\S+ metric names should not", p)
            or re.match(
                r'^vllm:iteration_tokens_total non-counter metrics should not have "_total"', p
            )
        ]
        assert problems == engines_own, f"{name}: {problems}"
        assert checked.returncode == (3 if engines_own else 0), name


def test_keda_scaled_objects_scale_pools_on_the_gateways_demand() -> None:
    rendered = template(
        "gateway.service.port=8080",
        "keda.scaledObjects[0].pool=docs",
        "keda.scaledObjects[0].maxReplicas=4",
        "keda.scaledObjects[0].targetPerReplica=262144",
    )
    (scaled,) = [d for d in rendered if d["kind"] == "ScaledObject"]
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("InferencePool", "docs")
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 4)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "metrics-api"
    assert trigger["metadata"] == {
        "url": "http://lw-laneway-gateway.ops:9090/laneway/demand",
        "valueLocation": "pools.ops/docs.queuedPromptTokens",
        "targetValue": "262144",
    }
    refused = run(
        tool("helm"), "template", "lw", str(CHART), "--set", "keda.scaledObjects[0].pool=docs"
    )
    assert refused.returncode != 0
    assert "maxReplicas" in refused.stderr
