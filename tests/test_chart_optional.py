"""The chart's state and optional objects: Redis (bundled, external, none), the network
policy, KV events' ports, the ServiceMonitor, and a default render that is secure."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import redis as redis_client
from support.chart import (
    ENGINE_NAMESPACES,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    RELEASE,
    Manifest,
    access_flags,
    container,
    deployment,
    env_of,
    gateway_config_documents,
    kinds,
    only,
    operator_image,
    operator_render,
    template,
)

from laneway.bench.harness.procs import laneway_argv
from laneway.bench.harness.redis_server import free_port
from laneway.cli import build_parser
from laneway.gateway.config import parse_documents
from laneway.gateway.state.redis_store import redis_settings
from laneway.routing.prefix_index import KVEventSource

# --- Redis ------------------------------------------------------------------------------


def test_bundled_redis_password_comes_from_a_generated_secret(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["redis"]
    redis = deployment(objects, "redis")
    service = only(objects, "Service", "-redis")
    secret = only(objects, "Secret", "-redis")
    env = env_of(deployment(objects, "gateway"))
    assert env["LANEWAY_REDIS_URL"]["value"] == (
        f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    )
    reference = env["LANEWAY_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": secret["metadata"]["name"], "key": "password"}
    assert len(secret["data"]["password"]) >= 32, "a generated password, base64"
    assert "value" not in env["LANEWAY_REDIS_PASSWORD"]
    redis_env = env_of(redis)
    assert redis_env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == reference
    assert "$(REDIS_PASSWORD)" in container(redis)["args"]


def test_bundled_redis_command_and_gateway_env_work_with_the_real_server(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    """Run the bundled Redis container's args (with the kubelet's $(VAR) expansion of the
    Secret's password) as a real redis-server, and connect the way the gateway's env says;
    it keeps an append-only file in its data volume and refuses writes above maxmemory."""
    objects = rendered["redis"]
    password = base64.b64decode(only(objects, "Secret", "-redis")["data"]["password"]).decode()
    redis = container(deployment(objects, "redis"))
    [mount] = redis["volumeMounts"]
    args = [a.replace("$(REDIS_PASSWORD)", password) for a in redis["args"]]
    assert args[args.index("--dir") + 1] == mount["mountPath"]
    args[args.index("--dir") + 1] = str(tmp_path)  # the emptyDir, here
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail("redis-server is missing: scripts/install-tools.sh installs it")
    server = subprocess.Popen([executable, *args, "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL)
    try:
        # The kubelet fills LANEWAY_REDIS_PASSWORD from the same Secret.
        gateway_env = container(deployment(objects, "gateway"))["env"]
        env = {e["name"]: e.get("value", password) for e in gateway_env}
        settings = redis_settings(None, env)
        assert settings is not None
        assert settings.password == password
        url = urllib.parse.urlsplit(settings.url)
        with_password = redis_client.Redis(host="127.0.0.1", port=port, password=settings.password)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert with_password.ping()
                break
            except redis_client.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with pytest.raises(redis_client.AuthenticationError):
            redis_client.Redis(host="127.0.0.1", port=port).ping()
        assert with_password.config_get("save") == {"save": ""}
        assert with_password.config_get("appendonly") == {"appendonly": "yes"}
        assert with_password.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        maxmemory = int(str(with_password.config_get("maxmemory")["maxmemory"]))
        assert maxmemory == 200 * 1024 * 1024
        limit = redis["resources"]["limits"]["memory"]
        assert limit == "256Mi"
        assert maxmemory < 256 * 1024 * 1024
        with_password.set("batch", "kept")
        with_password.bgrewriteaof()
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("appendonlydir/*.aof")):
            assert time.monotonic() < deadline, "no append-only file in the data volume"
            time.sleep(0.05)
        # A tenant's quota and largest file fit the bundled Redis, with room for others.
        args_of_gateway = container(deployment(objects, "gateway"))["args"]
        quota = int(args_of_gateway[args_of_gateway.index("--tenant-file-bytes") + 1])
        largest = int(args_of_gateway[args_of_gateway.index("--max-file-bytes") + 1])
        assert largest <= quota <= maxmemory // 3
        service = only(objects, "Service", "-redis")
        assert url.hostname == service["metadata"]["name"]
        assert url.port == service["spec"]["ports"][0]["port"]
        with_password.close()
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_external_redis_uses_the_existing_secret(rendered: dict[str, list[Manifest]]) -> None:
    objects = rendered["production"]
    env = env_of(deployment(objects, "gateway"))
    assert env["LANEWAY_REDIS_URL"]["value"] == "rediss://redis.cache.svc.cluster.local:6380/0"
    assert env["LANEWAY_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "laneway-redis-credentials",
        "key": "redis-password",
    }
    assert "Secret" not in kinds(objects)
    assert not [o for o in objects if o["metadata"]["name"].endswith("-redis")]


def test_no_redis_means_in_memory_state(rendered: dict[str, list[Manifest]]) -> None:
    env = env_of(deployment(rendered["default"], "gateway"))
    assert "LANEWAY_REDIS_URL" not in env
    assert "LANEWAY_REDIS_PASSWORD" not in env


# --- optional objects -------------------------------------------------------------------


def test_network_policy_lets_only_the_gateway_reach_engines(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["production"]
    gateway_pod = deployment(objects, "gateway")["spec"]["template"]["metadata"]["labels"]
    engines = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-engines")
    ]
    assert sorted(p["metadata"]["namespace"] for p in engines) == sorted(
        [NAMESPACE, *ENGINE_NAMESPACES]
    )
    for policy in engines:
        assert policy["spec"]["podSelector"] == {
            "matchExpressions": [{"key": "laneway.io/pool", "operator": "Exists"}]
        }
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        [ingress] = policy["spec"]["ingress"]
        [from_gateway, from_monitoring] = ingress["from"]
        assert from_gateway["podSelector"]["matchLabels"].items() <= gateway_pod.items()
        if policy["metadata"]["namespace"] == NAMESPACE:
            assert "namespaceSelector" not in from_gateway  # the policy's own namespace
        else:
            # From another namespace, only the release namespace's gateway pods.
            assert from_gateway["namespaceSelector"] == {
                "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
            }
        assert "namespaceSelector" in from_monitoring
    redis_policy = only(rendered["redis"], "NetworkPolicy", "-redis")
    assert redis_policy["spec"]["ingress"][0]["ports"] == [{"port": "redis", "protocol": "TCP"}]
    assert "NetworkPolicy" not in kinds(rendered["opt-out"])


@pytest.mark.parametrize("value_set", ["default", "production"])
def test_network_policy_opens_the_api_port_and_guards_the_metrics_port(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = rendered[value_set]
    policy = only(objects, "NetworkPolicy", "-gateway")
    gateway = deployment(objects, "gateway")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        gateway["spec"]["template"]["metadata"]["labels"].items()
    )
    api, metrics = policy["spec"]["ingress"]
    assert api == {"ports": [{"port": "http", "protocol": "TCP"}]}, "every client"
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    expected = (
        [{"podSelector": {}}]  # the release namespace only
        if value_set == "default"
        else [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    )
    assert metrics["from"] == expected
    names = {p["name"] for p in container(gateway)["ports"]}
    assert names == {"http", "metrics"}


KV_EVENTS = [
    {"pool": "chat", "bind": "tcp://*:5557"},
    {"pool": "documents", "bind": "tcp://0.0.0.0:5558", "blockSize": 32},
]


@pytest.mark.parametrize("all_namespaces", [False, True])
def test_kv_events_reach_the_gateway_config_and_open_their_ports_to_engines_only(
    helm: str, all_namespaces: bool
) -> None:
    objects = template(
        helm,
        "--set-json",
        f"gateway.config.picking.prefix.kvEvents={json.dumps(KV_EVENTS)}",
        "--set",
        f"watchAllNamespaces={str(all_namespaces).lower()}",
    )
    settings = parse_documents(gateway_config_documents(objects), "cm", allow_pools=False).settings
    assert settings.picking.prefix.kv_events == (
        KVEventSource("chat", "tcp://*:5557", 16),
        KVEventSource("documents", "tcp://0.0.0.0:5558", 32),
    )
    gateway = deployment(objects, "gateway")
    opened = {p["name"]: p["containerPort"] for p in container(gateway)["ports"]}
    assert opened == {"http": 8080, "metrics": 9090, "kv-events-0": 5557, "kv-events-1": 5558}
    # Apart from the API Service, and never outside the cluster: these ports shape routing.
    service = only(objects, "Service", "-gateway-kv-events")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= (
        gateway["spec"]["template"]["metadata"]["labels"].items()
    )
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (5557, "kv-events-0"),
        (5558, "kv-events-1"),
    ]
    api_service = only(objects, "Service", "-gateway")
    assert {p["name"] for p in api_service["spec"]["ports"]} == {"http", "metrics"}
    policy = only(objects, "NetworkPolicy", "-gateway")
    [from_engines] = [
        rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "kv-events-0"
    ]
    engine_pods = {"matchExpressions": [{"key": "laneway.io/pool", "operator": "Exists"}]}
    expected_peer: Manifest = {"podSelector": engine_pods}
    if all_namespaces:
        expected_peer["namespaceSelector"] = {}
    assert from_engines["from"] == [expected_peer]
    assert from_engines["ports"] == [
        {"port": "kv-events-0", "protocol": "TCP"},
        {"port": "kv-events-1", "protocol": "TCP"},
    ]
    for manifest in (gateway, service, policy):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)


def test_service_monitor_scrapes_the_gateway_service(rendered: dict[str, list[Manifest]]) -> None:
    objects = rendered["production"]
    monitor = only(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = only(objects, "Service", "-gateway")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert "ServiceMonitor" not in kinds(rendered["default"])


def test_default_render_is_secure(rendered: dict[str, list[Manifest]]) -> None:
    """The issue's secure defaults, all in the default install."""
    objects = rendered["default"]
    assert {"-engines", "-gateway"} <= {
        o["metadata"]["name"].removeprefix(f"{RELEASE}-laneway")
        for o in objects
        if o["kind"] == "NetworkPolicy"
    }
    only(objects, "Secret", "-api-key")
    gateway = container(deployment(objects, "gateway"))
    assert "--tenants" in gateway["args"]
    metrics_port = gateway["args"][gateway["args"].index("--metrics-port") + 1]
    assert metrics_port != gateway["args"][gateway["args"].index("--port") + 1]
    service_ports = {p["name"] for p in only(objects, "Service", "-gateway")["spec"]["ports"]}
    assert service_ports == {"http", "metrics"}
    operator = container(deployment(objects, "operator"))
    assert "--allowed-image-prefix" in operator["args"]
    assert "--allowed-env-secret" not in operator["args"]  # engines read no Secret
    engines = operator_render(
        [o for o in objects if o["kind"] == "InferencePool"],
        operator_image(objects),
        access_flags(operator["args"]),
    )
    for manifest in [*objects, *engines]:
        if manifest["kind"] == "Deployment":
            pod = manifest["spec"]["template"]["spec"]
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for each in pod["containers"]:
                assert each["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_operator_lets_engines_read_only_the_listed_secrets(helm: str) -> None:
    objects = template(helm, "--set", "operator.allowedEnvSecrets={hf-token,registry-creds}")
    args = container(deployment(objects, "operator"))["args"]
    flags = access_flags(args)
    secrets = [value for flag, value in zip(flags[::2], flags[1::2], strict=True)
               if flag == "--allowed-env-secret"]  # fmt: skip
    assert secrets == ["hf-token", "registry-creds"]
    # The flags the chart renders are ones `laneway render` (the operator's parser) takes,
    # and a chart pool reading another Secret is refused as the operator would refuse it.
    pool = next(o for o in objects if o["kind"] == "InferencePool")
    pool["spec"]["engine"]["env"] = [
        {"name": "K", "valueFrom": {"secretKeyRef": {"name": f"{RELEASE}-laneway-api-key"}}}
    ]
    refused = subprocess.run(
        laneway_argv("render", "-", *access_flags(args)),
        input=json.dumps(pool),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert f"reads Secret '{RELEASE}-laneway-api-key'" in refused.stderr
    assert "the Secrets it allows are hf-token, registry-creds" in refused.stderr


def test_the_default_gateway_is_one_replica_with_the_gateways_own_file_limits(
    rendered: dict[str, list[Manifest]],
) -> None:
    """No Redis by default, so one replica: apart, replicas would each keep their own limits
    and answer 501 for files and batches."""
    gateway = deployment(rendered["default"], "gateway")
    assert gateway["spec"]["replicas"] == 1
    args = container(gateway)["args"]
    assert args[args.index("--max-file-bytes") + 1] == "104857600"
    assert args[args.index("--tenant-file-bytes") + 1] == "1073741824"
    assert "--allow-unauthenticated" not in args


def test_a_gateway_without_auth_is_told_it_may_listen_unauthenticated(helm: str) -> None:
    args = container(deployment(template(helm, "--set", "gateway.auth.enabled=false"), "gateway"))[
        "args"
    ]
    assert "--tenants" not in args
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert "--allow-unauthenticated" in args
    # The flags parse as `laneway gateway` takes them.
    parsed = build_parser().parse_args(args)
    assert parsed.allow_unauthenticated is True
