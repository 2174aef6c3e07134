"""The Helm chart, checked with the real `helm` and the upstream Kubernetes schemas.

Every values set in charts/laneway/ci/ (plus the defaults) is linted strictly and rendered
once; every rendered object is validated against the Kubernetes OpenAPI schema of the oldest
Kubernetes the chart supports and of the newest kubernetes-validate knows, and the gateway's
objects against what the gateway reads. RBAC, Redis and the optional objects, the example
pools, and bad values are checked in test_chart_rbac.py, test_chart_optional.py,
test_chart_pools.py and test_chart_values.py.
"""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest
from support.chart import (
    CHART,
    CLUSTER_SCOPED,
    CLUSTER_WIDE_SETS,
    CUSTOM_KINDS,
    ENGINE_NAMESPACES,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    RELEASE,
    STANDARD_LABELS,
    VALUE_SETS,
    Manifest,
    container,
    deployment,
    gateway_config_documents,
    only,
    parse_laneway,
    run_helm,
    template,
    tenants_volume,
    values_args,
)

from laneway.gateway.config import GatewaySettings, parse_documents
from laneway.gateway.state.tenants import load_tenants

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


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_container_command_is_one_laneway_accepts(
    rendered: dict[str, list[Manifest]], value_set: str
) -> None:
    for component, command in (("gateway", "gateway"), ("operator", "operator"), ("picker", "epp")):
        found = [
            o
            for o in rendered[value_set]
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{component}")
        ]
        for manifest in found:
            parsed = parse_laneway(container(manifest)["args"])
            assert parsed.command == command


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


def test_gateway_replicas_spread_over_nodes(rendered: dict[str, list[Manifest]]) -> None:
    # Several replicas need Redis (one replica is the default without it); ci/redis-values.
    gateway = deployment(rendered["redis"], "gateway")
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
    pdb = only(rendered["redis"], "PodDisruptionBudget")
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
