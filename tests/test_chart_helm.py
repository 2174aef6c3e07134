"""The Helm chart, checked with the real `helm` and the upstream Kubernetes schemas.

Every values set in charts/laneway/ci/ (plus the defaults) is linted strictly and rendered
once; every rendered object is validated against the Kubernetes OpenAPI schema of the oldest
Kubernetes the chart supports and of the newest kubernetes-validate knows, InferencePools
against the CRD's own schema and laneway's parser, and the gateway's ConfigMap against the
gateway's config parser. Bad values must fail `helm template` with a message that says what
to change.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import openai
import pytest
import redis as redis_client
import yaml
from support.merging import merged

from laneway import __version__
from laneway.api import (
    API_VERSION,
    KIND,
    InferencePool,
    KVEventsSpec,
    check_pool_set,
    parse_pool,
)
from laneway.bench.procs import Children, laneway_argv
from laneway.bench.redis_server import free_port
from laneway.cli import build_parser
from laneway.gateway.config import GatewaySettings, parse_documents
from laneway.gateway.state.redis_store import redis_settings
from laneway.gateway.state.tenants import load_tenants
from laneway.operator.cli import parse_allowed_prefixes, parse_images
from laneway.operator.render import RenderOptions, refused_image
from laneway.routing.prefix_index import KVEventSource

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "laneway"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = ["default", *(path.name.removesuffix("-values.yaml") for path in CI_VALUES)]
RELEASE, NAMESPACE = "lw", "serving"
# The oldest Kubernetes Chart.yaml's kubeVersion admits, and the newest schemas installed.
KUBERNETES_VERSIONS = ("1.27", kubernetes_validate.latest_version())
# Kinds that are not built into Kubernetes: checked by their own tests below.
CUSTOM_KINDS = {"InferencePool", "ServiceMonitor"}
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> str:
    path = shutil.which("helm")
    if path is None:
        pytest.fail(
            "helm is not on PATH: scripts/test.sh installs it (scripts/install-tools.sh) into "
            ".tools/bin and puts that first on PATH"
        )
    return path


def values_args(value_set: str) -> list[str]:
    return [] if value_set == "default" else ["-f", str(CHART / "ci" / f"{value_set}-values.yaml")]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


def template(helm: str, *args: str) -> list[Manifest]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[Manifest]]:
    return {name: template(helm, *values_args(name)) for name in VALUE_SETS}


def only(objects: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = [
        o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def kinds(objects: list[Manifest]) -> set[str]:
    return {o["kind"] for o in objects}


def deployment(objects: list[Manifest], component: str) -> Manifest:
    return only(objects, "Deployment", f"-{component}")


def container(deployment_object: Manifest) -> Manifest:
    containers = deployment_object["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Manifest = containers[0]
    return result


def env_of(deployment_object: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container(deployment_object).get("env", [])}


def crd() -> Manifest:
    document: Manifest = yaml.safe_load(
        (CHART / "crds" / "laneway.io_inferencepools.yaml").read_text()
    )
    return document


# --- lint and schema validation of every rendered object --------------------------------


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_strict_passes(helm: str, value_set: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *values_args(value_set))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_built_in_object_matches_the_kubernetes_schema(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = [o for o in rendered[value_set] if o["kind"] not in CUSTOM_KINDS]
    assert objects
    for manifest in objects:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                where = "/".join(str(p) for p in error.path)
                pytest.fail(
                    f"{value_set}: {manifest['kind']} {manifest['metadata']['name']} "
                    f"invalid for Kubernetes {version} at {where}: {error.message}"
                )


def test_schema_validation_is_strict_enough_to_catch_a_misplaced_field(
    rendered: dict[str, list[Manifest]],
) -> None:
    broken = copy.deepcopy(deployment(rendered["default"], "gateway"))
    container(broken)["readinessProbe"]["path"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError, match="path"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}
CLUSTER_WIDE_SETS = [s for s in VALUE_SETS if s == "production"]  # watchAllNamespaces: true
ENGINE_NAMESPACES = ("inference",)  # production's networkPolicy.engineNamespaces


def test_every_object_lives_in_the_release_namespace_unless_cluster_scoped(
    rendered: dict[str, list[Manifest]],
) -> None:
    for objects in rendered.values():
        for manifest in objects:
            if manifest["kind"] == "NetworkPolicy" and manifest["metadata"]["namespace"] in (
                ENGINE_NAMESPACES
            ):
                continue  # the engines' policy, also where other namespaces' engines run
            expected = None if manifest["kind"] in CLUSTER_SCOPED else NAMESPACE
            assert manifest["metadata"].get("namespace") == expected, manifest["metadata"]["name"]


def test_every_object_carries_the_standard_labels(rendered: dict[str, list[Manifest]]) -> None:
    for objects in rendered.values():
        for manifest in objects:
            labels = manifest["metadata"]["labels"]
            missing = [key for key in STANDARD_LABELS if key not in labels]
            assert not missing, f"{manifest['kind']} {manifest['metadata']['name']}: {missing}"
            assert labels["app.kubernetes.io/instance"] == RELEASE
            assert labels["app.kubernetes.io/managed-by"] == "Helm"


# --- the gateway ------------------------------------------------------------------------


def gateway_config_documents(objects: list[Manifest]) -> list[Any]:
    config_map = only(objects, "ConfigMap", "-gateway")
    return list(yaml.safe_load_all(config_map["data"]["gateway.yaml"]))


def test_default_gateway_config_is_exactly_the_gateways_own_defaults(
    rendered: dict[str, list[Manifest]],
) -> None:
    documents = gateway_config_documents(rendered["default"])
    assert [d["kind"] for d in documents] == ["GatewayConfig"]
    parsed = parse_documents(documents, "configmap", allow_pools=False)
    assert parsed.settings == GatewaySettings()
    assert parsed.pools == ()


def test_production_gateway_config_reaches_the_gateway(
    rendered: dict[str, list[Manifest]],
) -> None:
    settings = parse_documents(
        gateway_config_documents(rendered["production"]), "configmap", allow_pools=False
    ).settings
    assert settings.picking.weights["prefillTokens"] == 4
    assert settings.queue.max_waiting == 4096
    assert settings.tokenizer.kind == "huggingface"
    assert settings.tokenizer.path == "/etc/laneway/tokenizer/tokenizer.json"
    assert settings.max_body_bytes == 8388608
    gateway = deployment(rendered["production"], "gateway")
    mounts = {m["mountPath"] for m in container(gateway)["volumeMounts"]}
    assert "/etc/laneway/tokenizer" in mounts


def tenants_volume(gateway: Manifest) -> Manifest:
    """The volume mounted where the gateway's --tenants points."""
    args = container(gateway)["args"]
    path = args[args.index("--tenants") + 1]
    mount = next(m for m in container(gateway)["volumeMounts"] if m["mountPath"] == path)
    volumes = gateway["spec"]["template"]["spec"]["volumes"]
    volume: Manifest = next(v for v in volumes if v["name"] == mount["name"])
    return volume


def test_tenants_secret_is_mounted_where_the_gateway_reads_it(
    rendered: dict[str, list[Manifest]],
) -> None:
    volume = tenants_volume(deployment(rendered["production"], "gateway"))
    assert volume["secret"] == {"secretName": "laneway-tenants"}
    assert "-api-key" not in {o["metadata"]["name"][-8:] for o in rendered["production"]}
    assert "--tenants" not in container(deployment(rendered["opt-out"], "gateway"))["args"]


def test_default_auth_is_a_generated_key_the_gateway_reads(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    objects = rendered["default"]
    secret = only(objects, "Secret", "-api-key")
    key = base64.b64decode(secret["data"]["api-key"]).decode()
    assert re.fullmatch(r"sk-laneway-[A-Za-z0-9]{40}", key)
    volume = tenants_volume(deployment(objects, "gateway"))
    # Only the tenants file is projected: the gateway reads every file of the directory.
    assert volume["secret"] == {
        "secretName": secret["metadata"]["name"],
        "items": [{"key": "tenants.yaml", "path": "tenants.yaml"}],
    }
    mounted = tmp_path / "tenants"
    mounted.mkdir()
    (mounted / "tenants.yaml").write_bytes(base64.b64decode(secret["data"]["tenants.yaml"]))
    directory = load_tenants(mounted)
    tenant = directory.authenticate(f"Bearer {key}")
    assert tenant is not None
    assert tenant.name == "default"
    assert directory.authenticate("Bearer sk-guess") is None


def test_default_batch_flags_are_the_gateways_own_defaults(
    rendered: dict[str, list[Manifest]],
) -> None:
    args = parse_laneway(container(deployment(rendered["default"], "gateway"))["args"])
    defaults = parse_laneway(["gateway", "--kubernetes"])
    for flag in ("batch_concurrency", "batch_lease", "max_file_bytes"):
        assert getattr(args, flag) == getattr(defaults, flag), flag


def parse_laneway(argv: list[str]) -> argparse.Namespace:
    """Parse a container's args with the real `laneway` parser; fail on what it rejects."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as error:
        pytest.fail(f"laneway rejects {argv}: exit {error.code}")


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_container_command_is_one_laneway_accepts(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    for component in ("gateway", "operator"):
        found = [
            o
            for o in rendered[value_set]
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{component}")
        ]
        for manifest in found:
            parsed = parse_laneway(container(manifest)["args"])
            assert parsed.command == component


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_gateway_runs_in_kubernetes_mode_with_its_config_mounted(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = rendered[value_set]
    gateway = deployment(objects, "gateway")
    main = container(gateway)
    args = main["args"]
    assert args[0] == "gateway"
    assert "--kubernetes" in args
    if value_set in CLUSTER_WIDE_SETS:
        assert "--all-namespaces" in args
        assert "--namespace" not in args
    else:
        assert args[args.index("--namespace") + 1] == NAMESPACE
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(
        v for v in gateway["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    config_map = only(objects, "ConfigMap", "-gateway")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_path.name in config_map["data"]
    port = int(args[args.index("--port") + 1])
    ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    if "--metrics-port" in args:
        metrics_port = int(args[args.index("--metrics-port") + 1])
        ports.append({"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"})
    assert main["ports"] == ports
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["resources"]["requests"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_pod_is_non_root_with_a_read_only_root_filesystem(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    for manifest in rendered[value_set]:
        if manifest["kind"] != "Deployment":
            continue
        pod = manifest["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for each in pod["containers"]:
            security = each["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, manifest["metadata"]["name"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]


def test_gateway_defaults_to_several_replicas_spread_over_nodes(
    rendered: dict[str, list[Manifest]],
) -> None:
    gateway = deployment(rendered["default"], "gateway")
    assert gateway["spec"]["replicas"] >= 2
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert container(gateway)["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    preferred = gateway["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preferred[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    pdb = only(rendered["default"], "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_production_values_harden_the_gateway(rendered: dict[str, list[Manifest]]) -> None:
    objects = rendered["production"]
    gateway = deployment(objects, "gateway")
    assert "replicas" not in gateway["spec"], "the HPA owns the replica count"
    required = gateway["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required[0]["topologyKey"] == "kubernetes.io/hostname"
    hpa = only(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": gateway["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert only(objects, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 2,
        "selector": gateway["spec"]["selector"],
    }
    assert gateway["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "registry-credentials"}
    ]
    assert only(objects, "Service", "-gateway")["spec"]["type"] == "LoadBalancer"


def test_services_select_the_pods_of_their_deployments(rendered: dict[str, list[Manifest]]) -> None:
    for objects in rendered.values():
        for service in (o for o in objects if o["kind"] == "Service"):
            name = service["metadata"]["name"]
            target = only(objects, "Deployment", name.removeprefix(f"{RELEASE}-laneway"))
            pod = target["spec"]["template"]
            assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
            port_names = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
            assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


def test_config_change_rolls_the_gateway(helm: str) -> None:
    def checksum(*args: str) -> str:
        gateway = deployment(template(helm, *args), "gateway")
        annotation: str = gateway["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return annotation

    assert checksum() != checksum("--set", "gateway.config.queue.maxWaiting=10")


# --- RBAC -------------------------------------------------------------------------------

READ = {"get", "list", "watch"}


def rules_of(objects: list[Manifest], kind: str, suffix: str) -> dict[tuple[str, str], set[str]]:
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in only(objects, kind, suffix)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules[(group, resource)] = set(rule["verbs"])
    return rules


def documented_rules(component: str) -> dict[tuple[str, str], set[str]]:
    """The rules manifests/rbac/ grants a component, which the component's own tests check
    against the API calls it makes."""
    path = ROOT / "manifests" / "rbac" / f"{component}.yaml"
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return rules_of(documents, "ClusterRole", f"laneway-{component}")


@pytest.mark.parametrize("value_set", ["default", *CLUSTER_WIDE_SETS])
def test_roles_grant_exactly_the_documented_rules(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = rendered[value_set]
    kind = "ClusterRole" if value_set in CLUSTER_WIDE_SETS else "Role"
    gateway = rules_of(objects, kind, "-gateway")
    assert gateway == documented_rules("gateway")
    assert all(verbs <= READ for verbs in gateway.values()), "the gateway only reads"
    assert rules_of(objects, kind, "-operator") == documented_rules("operator")
    if kind == "ClusterRole":
        names = {o["metadata"]["name"] for o in objects if o["kind"] in CLUSTER_SCOPED}
        assert all(name.startswith(f"{NAMESPACE}-") for name in names), "no clash across releases"


def test_a_record_asking_for_crd_access_fails_rendering(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "laneway"
    shutil.copytree(CHART, chart)
    record = chart / "files" / "rbac-operator.yaml"
    documents = [d for d in yaml.safe_load_all(record.read_text()) if d]
    role = next(d for d in documents if d["kind"] == "ClusterRole")
    role["rules"].append(
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list"],
        }
    )
    record.write_text(yaml.safe_dump_all(documents))
    result = run_helm(helm, "template", RELEASE, str(chart))
    assert result.returncode != 0
    assert "asks for CRD access, which a namespaced Role cannot grant" in result.stderr


def test_nothing_is_granted_beyond_the_release_namespace_unless_asked(
    rendered: dict[str, list[Manifest]],
) -> None:
    for value_set, objects in rendered.items():
        assert bool(kinds(objects) & CLUSTER_SCOPED) == (value_set in CLUSTER_WIDE_SETS)
    operator = container(deployment(rendered["production"], "operator"))
    assert "--namespace" not in operator["args"], "the operator's default: every namespace"


def test_no_rule_uses_a_wildcard_and_bindings_name_rendered_accounts(
    rendered: dict[str, list[Manifest]],
) -> None:
    for objects in rendered.values():
        accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
        for manifest in objects:
            for rule in manifest.get("rules", []):
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[key], manifest["metadata"]["name"]
            if manifest["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                roles = {
                    o["metadata"]["name"]
                    for o in objects
                    if o["kind"] == manifest["roleRef"]["kind"]
                }
                assert manifest["roleRef"]["name"] in roles
                for subject in manifest["subjects"]:
                    assert subject["name"] in accounts
                    assert subject["namespace"] == NAMESPACE
        for manifest in objects:
            if manifest["kind"] == "Deployment" and manifest["metadata"]["name"].endswith(
                ("-gateway", "-operator")
            ):
                assert manifest["spec"]["template"]["spec"]["serviceAccountName"] in accounts


def test_operator_off_renders_no_operator_objects(rendered: dict[str, list[Manifest]]) -> None:
    objects = rendered["operator-off"]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-operator")]
    deployment(objects, "gateway")
    operator = container(deployment(rendered["default"], "operator"))
    assert operator["args"][:3] == ["operator", "--namespace", NAMESPACE]
    health_port = int(operator["args"][operator["args"].index("--health-port") + 1])
    assert operator["ports"] == [
        {"name": "health", "containerPort": health_port, "protocol": "TCP"}
    ]
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "LANEWAY_IMAGE", "value": f"laneway:{__version__}"} in operator["env"]


def test_operator_reads_demand_from_the_releases_gateway_service(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["default"]
    service = only(objects, "Service", "-gateway")
    api_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    gateway_url = env_of(deployment(objects, "operator"))["LANEWAY_GATEWAY_URL"]["value"]
    assert gateway_url == f"http://{service['metadata']['name']}.{NAMESPACE}:{api_port}"


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
    rendered: dict[str, list[Manifest]],
) -> None:
    """Run the bundled Redis container's args (with the kubelet's $(VAR) expansion of the
    Secret's password) as a real redis-server, and connect the way the gateway's env says."""
    objects = rendered["redis"]
    password = base64.b64decode(only(objects, "Secret", "-redis")["data"]["password"]).decode()
    redis = container(deployment(objects, "redis"))
    args = [a.replace("$(REDIS_PASSWORD)", password) for a in redis["args"]]
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
        assert with_password.config_get("appendonly") == {"appendonly": "no"}
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
    engines = operator_render(
        [o for o in objects if o["kind"] == "InferencePool"], operator_image(objects)
    )
    for manifest in [*objects, *engines]:
        if manifest["kind"] == "Deployment":
            pod = manifest["spec"]["template"]["spec"]
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for each in pod["containers"]:
                assert each["securityContext"]["readOnlyRootFilesystem"] is True


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
    assert realtime == KVEventsSpec(f"tcp://{name}.{namespace}.svc:5557", block_size=16)
    assert 5557 in {p["port"] for p in service["spec"]["ports"]}
    assert pools["sim-batch"].spec.engine.kv_events == KVEventsSpec("tcp://elsewhere:6000")
    quiet = template(helm)
    assert all("kvEvents" not in p["spec"]["engine"] for p in quiet if p["kind"] == KIND)


def operator_render(pools: list[Manifest], image: str) -> list[Manifest]:
    """What the operator creates for `pools`: `laneway render`, the operator's own code."""
    result = subprocess.run(
        laneway_argv("render", "-", "--image", f"simulator={image}"),
        input=yaml.safe_dump_all(pools),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def operator_image(objects: list[Manifest]) -> str:
    env = container(deployment(objects, "operator"))["env"]
    image: str = next(e["value"] for e in env if e["name"] == "LANEWAY_IMAGE")
    return image


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
    assert "without Redis keep separate state" in notes
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


# --- bad values -------------------------------------------------------------------------


def nested(dotted: str, value: Any) -> Manifest:
    """{"a.b": 1} style shorthand -> {"a": {"b": 1}}."""
    result: Any = value
    for key in reversed(dotted.split(".")):
        result = {key: result}
    return dict(result)


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
