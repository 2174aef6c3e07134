"""The chart's example pools: they pass the CRD's schema and laneway's checks, render into
engines the network policy guards, and the gateway container serves them through both
lanes."""

from __future__ import annotations

import base64
import copy
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import openai
import pytest
import yaml
from support.chart import (
    CHART,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    Manifest,
    container,
    crd,
    deployment,
    gateway_config_documents,
    only,
    operator_image,
    operator_render,
    parse_laneway,
    template,
    tenants_volume,
)

from laneway.api import (
    API_VERSION,
    KIND,
    InferencePool,
    KVEventsSpec,
    check_pool_set,
    parse_pool,
)
from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import free_port
from laneway.operator.cli import parse_allowed_prefixes, parse_images
from laneway.operator.render import RenderOptions, refused_image


def engine_pool(engine: Manifest) -> InferencePool:
    return parse_pool(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "p", "namespace": NAMESPACE},
            "spec": {"lane": "interactive", "model": "m", "engine": engine},
        }
    )


def operator_options(objects: list[Manifest]) -> RenderOptions:
    """The operator's settings as its chart flags give them, parsed by the operator."""
    args = parse_laneway(container(deployment(objects, "operator"))["args"])
    return RenderOptions(
        images=parse_images(args.image, operator_image(objects)),
        allowed_image_prefixes=parse_allowed_prefixes(args.allowed_image_prefix),
    )


@pytest.mark.parametrize("value_set", ["default", "production"])
def test_operator_runs_only_allowed_images_and_those_include_its_own(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = rendered[value_set]
    options = operator_options(objects)
    assert options.allowed_image_prefixes
    # The default list admits every engine's default image; production's leaves SGLang out.
    allowed = {"simulator", "vllm", "sglang"} if value_set == "default" else {"simulator", "vllm"}
    for kind in ("simulator", "vllm", "sglang"):
        refusal = refused_image(engine_pool({"kind": kind}), options)
        assert (refusal is None) == (kind in allowed), kind
    for pool in (o for o in objects if o["kind"] == "InferencePool"):
        assert refused_image(parse_pool(pool), options) is None
    evil = refused_image(engine_pool({"kind": "vllm", "image": "evil.example/x:1"}), options)
    assert evil is not None
    assert all(prefix in evil for prefix in options.allowed_image_prefixes)
    opt_out = operator_options(rendered["opt-out"])
    assert opt_out.allowed_image_prefixes == ()


def openapi_schema(document: Manifest) -> Mapping[str, Any]:
    [version] = document["spec"]["versions"]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_example_pools_pass_the_crd_schema_and_laneways_own_checks(
    rendered: dict[str, list[Manifest]],
) -> None:
    pools = [o for o in rendered["default"] if o["kind"] == "InferencePool"]
    assert {p["spec"]["lane"] for p in pools} == {"interactive", "batch"}
    assert {p["spec"]["engine"]["kind"] for p in pools} == {"simulator"}
    # OpenAPI v3.0 schemas (boolean exclusiveMinimum) read as JSON Schema draft 4.
    validator = jsonschema.Draft4Validator(openapi_schema(crd()))
    for pool in pools:
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(pool)]
        assert not errors, errors
    parsed = [parse_pool(pool) for pool in pools]
    assert check_pool_set(parsed) == []
    assert not any(o["kind"] == "InferencePool" for o in rendered["minimal"])


def test_example_pools_the_gateway_hears_kv_events_from_publish_to_its_service(
    helm: str,
) -> None:
    """An example pool named in gateway.config.picking.prefix.kvEvents gets
    spec.engine.kvEvents pointing at the chart's KV events Service on that entry's port, so
    the operator renders its engines' --kv-events-config; one whose spec names its own keeps
    it, and the others publish nothing."""
    own = {"endpoint": "tcp://elsewhere:6000"}
    pools_with_own = yaml.safe_load((CHART / "values.yaml").read_text())["examplePools"]["pools"]
    (batch,) = [p for p in pools_with_own if p["name"] == "sim-batch"]
    batch["spec"]["engine"]["kvEvents"] = own
    sources = [
        {"pool": "sim-realtime", "bind": "tcp://*:5557"},
        {"pool": "sim-batch", "bind": "tcp://*:5558"},
    ]
    objects = template(
        helm,
        "--set-json",
        f"gateway.config.picking.prefix.kvEvents={json.dumps(sources)}",
        "--set-json",
        f"examplePools.pools={json.dumps(pools_with_own)}",
    )
    service = only(objects, "Service", "-gateway-kv-events")
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    pools = {p["metadata"]["name"]: parse_pool(p) for p in objects if p["kind"] == "InferencePool"}
    realtime = pools["sim-realtime"].spec.engine.kv_events
    assert realtime == KVEventsSpec(endpoint=f"tcp://{name}.{namespace}.svc:5557", block_size=16)
    assert 5557 in {p["port"] for p in service["spec"]["ports"]}
    assert pools["sim-batch"].spec.engine.kv_events == KVEventsSpec(endpoint="tcp://elsewhere:6000")
    quiet = template(helm)
    assert all("kvEvents" not in p["spec"]["engine"] for p in quiet if p["kind"] == KIND)


def test_example_pools_render_into_engines_the_network_policy_guards(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["redis"]
    image = operator_image(objects)
    pools = [o for o in objects if o["kind"] == "InferencePool"]
    children = operator_render(pools, image)
    engines = [c for c in children if c["kind"] == "Deployment"]
    assert len(engines) == len(pools)
    selector = only(objects, "NetworkPolicy", "-engines")["spec"]["podSelector"]
    [expression] = selector["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("laneway.io/pool", "Exists")
    for engine in engines:
        pod = engine["spec"]["template"]
        assert expression["key"] in pod["metadata"]["labels"]
        assert [c["image"] for c in pod["spec"]["containers"]] == [image]
    for child in children:
        kubernetes_validate.validate(child, KUBERNETES_VERSIONS[-1], strict=True)


def on_loopback(args: list[str]) -> list[str]:
    """A container's flags for this machine: loopback instead of 0.0.0.0, free ports."""
    local = list(args)
    local[local.index("--host") + 1] = "127.0.0.1"
    local[local.index("--port") + 1] = "0"
    if "--metrics-port" in local:
        local[local.index("--metrics-port") + 1] = str(free_port())
    return local


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def test_gateway_container_serves_the_example_pools_through_both_lanes(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    """The chart's gateway command and GatewayConfig, in front of the example pools' engines
    as the operator renders them, run here as processes: probes answer, lanes route.
    Only what needs a cluster changes: pools come from the file instead of the API."""
    objects = rendered["default"]
    pools = [o for o in objects if o["kind"] == "InferencePool"]
    engines = {
        e["metadata"]["labels"]["laneway.io/pool"]: container(e)
        for e in operator_render(pools, operator_image(objects))
        if e["kind"] == "Deployment"
    }
    gateway = container(deployment(objects, "gateway"))
    args = on_loopback(gateway["args"])
    at = args.index("--kubernetes")
    assert args[at : at + 3] == ["--kubernetes", "--namespace", NAMESPACE]
    del args[at : at + 3]
    config = tmp_path / "gateway.yaml"
    args[args.index("--config") + 1] = str(config)
    # The generated API-key Secret, as the kubelet mounts it where --tenants points.
    secret = only(objects, "Secret", "-api-key")
    tenants = tmp_path / "tenants"
    tenants.mkdir()
    for item in tenants_volume(deployment(objects, "gateway"))["secret"]["items"]:
        (tenants / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
    args[args.index("--tenants") + 1] = str(tenants)
    api_key = base64.b64decode(secret["data"]["api-key"]).decode()
    metrics_url = f"http://127.0.0.1:{args[args.index('--metrics-port') + 1]}/metrics"

    with Children() as children:
        for pool in pools:
            engine = engines[pool["metadata"]["name"]]
            assert engine["command"] == ["laneway"]
            sim_args = on_loopback(engine["args"])
            sim = children.start_laneway(sim_args[0], sim_args[1:], name=pool["metadata"]["name"])
            pool["status"] = {"endpoints": [sim.url]}
        config.write_text(yaml.safe_dump_all([*gateway_config_documents(objects), *pools]))
        url = children.start_laneway(args[0], args[1:]).url

        readiness = url + gateway["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + 120
        while http_status(readiness) != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert http_status(readiness) == 200
        assert http_status(url + gateway["livenessProbe"]["httpGet"]["path"]) == 200
        assert http_status(f"{url}/metrics") == 404
        assert http_status(metrics_url) == 200
        assert http_status(f"{url}/v1/models") == 401

        anonymous = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0)
        [model] = {m for p in pools for m in p["spec"]["routing"]["models"]}
        short = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert (short.headers["x-laneway-lane"], short.headers["x-laneway-pool"]) == (
            "interactive",
            "sim-realtime",
        )
        document = "Clause 7 limits liability. " * 1000
        long = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": document}], max_tokens=4
        )
        assert (long.headers["x-laneway-lane"], long.headers["x-laneway-pool"]) == (
            "batch",
            "sim-batch",
        )
        assert children.crashed() == []


def test_example_pool_schema_check_rejects_a_bad_pool(rendered: dict[str, list[Manifest]]) -> None:
    pool = copy.deepcopy(next(o for o in rendered["default"] if o["kind"] == "InferencePool"))
    pool["spec"]["lane"] = "fast"
    validator = jsonschema.Draft4Validator(openapi_schema(crd()))
    assert any(e.validator == "enum" for e in validator.iter_errors(pool))
