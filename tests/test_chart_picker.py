"""The chart's picker mode (`picker.enabled`): laneway's endpoint picker as a Deployment and a
Service with its gRPC port, the operator told to render upstream InferencePools that name
it, and an example HTTPRoute to the model's upstream pool; it takes the gateway's tenants and
Redis from the same values, and its own fairness-id and objectives settings. The standard
kinds are checked
against the upstream Kubernetes schemas; the upstream pools the operator would render for the
chart's pools (`laneway render`, the operator's code, with the chart's operator flags) against
the upstream InferencePool CRD, and the HTTPRoute's backend against their names."""

from __future__ import annotations

import itertools
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from support.chart import (
    CHART,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    RELEASE,
    Manifest,
    access_flags,
    container,
    deployment,
    env_of,
    only,
    operator_image,
    operator_render,
    parse_laneway,
    run_helm,
    template,
    tenants_volume,
)
from support.crd import admit, upstream_schema

from laneway.gateway.config import parse_documents
from laneway.gateway.epp.objectives import load_objectives

PICKER = f"{RELEASE}-laneway-picker"
ON = ("--set", "picker.enabled=true")


def picker_flags(operator_args: list[str]) -> list[str]:
    flags = []
    for flag, value in itertools.pairwise(operator_args):
        if flag.startswith("--picker-"):
            flags += [flag, value]
    return flags


def upstream_of(objects: list[Manifest]) -> list[Manifest]:
    """What the chart's operator renders for the chart's pools: children and upstream pools."""
    args = container(deployment(objects, "operator"))["args"]
    pools = [o for o in objects if o["kind"] == "InferencePool"]
    return operator_render(
        pools, operator_image(objects), [*access_flags(args), *picker_flags(args)]
    )


def test_the_picker_is_off_by_default(helm: str) -> None:
    objects = template(helm)
    assert not [o for o in objects if o["metadata"]["name"] == PICKER]
    assert "HTTPRoute" not in {o["kind"] for o in objects}
    assert not picker_flags(container(deployment(objects, "operator"))["args"])


def test_the_picker_runs_behind_a_grpc_service(helm: str) -> None:
    objects = template(helm, *ON)
    picker = deployment(objects, "picker")
    service = only(objects, "Service", "-picker")
    for manifest in (picker, service, only(objects, "ConfigMap", "-picker")):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)
    [port] = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("grpc", 9002, "grpc")
    assert port["appProtocol"] == "kubernetes.io/h2c"
    pod = picker["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    engine = container(picker)
    assert engine["args"][0] == "epp"
    assert engine["args"][engine["args"].index("--config") + 1] == "/etc/laneway/picker/picker.yaml"
    assert engine["args"][engine["args"].index("--port") + 1] == "9002"
    assert {p["name"]: p["containerPort"] for p in engine["ports"]} == {
        "grpc": 9002,
        "metrics": 9090,
    }
    assert engine["readinessProbe"]["grpc"] == {
        "port": 9002,
        "service": "envoy.service.ext_proc.v3.ExternalProcessor",
    }
    assert engine["securityContext"]["readOnlyRootFilesystem"] is True

    # It watches the release's pools as the gateway does, with the gateway's account (whose
    # Role grants that watch), and its config holds only the settings, as --kubernetes needs.
    assert engine["args"][1:4] == ["--kubernetes", "--namespace", NAMESPACE]
    gateway = deployment(objects, "gateway")["spec"]["template"]["spec"]
    assert pod["spec"]["serviceAccountName"] == gateway["serviceAccountName"]
    assert pod["spec"]["automountServiceAccountToken"] is True
    config = only(objects, "ConfigMap", "-picker")["data"]["picker.yaml"]
    settings = only(objects, "ConfigMap", "-gateway")["data"]["gateway.yaml"]
    assert list(yaml.safe_load_all(config)) == list(yaml.safe_load_all(settings))
    parse_documents(list(yaml.safe_load_all(config)), "picker.yaml", allow_pools=False)
    everywhere = container(
        deployment(template(helm, *ON, "--set", "watchAllNamespaces=true"), "picker")
    )
    assert everywhere["args"][1:3] == ["--kubernetes", "--all-namespaces"]


def test_the_operator_renders_upstream_pools_naming_the_picker(helm: str) -> None:
    objects = template(helm, *ON, "--set", "picker.failureMode=FailOpen")
    args = container(deployment(objects, "operator"))["args"]
    assert picker_flags(args) == [
        "--picker-service", PICKER, "--picker-failure-mode", "FailOpen",
    ]  # fmt: skip
    rendered = upstream_of(objects)
    upstream = [o for o in rendered if o["apiVersion"] == "inference.networking.k8s.io/v1"]
    [demo] = upstream  # both example pools answer laneway-demo
    assert demo["metadata"]["name"] == "laneway-demo"
    assert demo["metadata"]["namespace"] == NAMESPACE
    assert demo["spec"]["endpointPickerRef"]["name"] == PICKER
    assert demo["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    assert admit(demo, upstream_schema()) == []
    # Its selector finds both lanes' engine pods the operator renders.
    [(label, value)] = demo["spec"]["selector"]["matchLabels"].items()
    engines = [o for o in rendered if o["kind"] == "Deployment"]
    assert len(engines) == 2
    for engine in engines:
        assert engine["spec"]["template"]["metadata"]["labels"][label] == value


@pytest.mark.parametrize("model", ["laneway-demo", "meta-llama/Llama-3.1-8B-Instruct"])
def test_the_example_route_sends_to_the_models_upstream_pool(helm: str, model: str) -> None:
    objects = template(helm, *ON, "--set", f"picker.httpRoute.model={model}")
    # The chart's pools answer the route's model too.
    for pool in (o for o in objects if o["kind"] == "InferencePool"):
        pool["spec"]["routing"]["models"] = [model]
    names = [
        o["metadata"]["name"]
        for o in upstream_of(objects)
        if o["apiVersion"] == "inference.networking.k8s.io/v1"
    ]
    route = only(objects, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway"}]
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": names[0]}
    ]
    assert names == [rule["backendRefs"][0]["name"]]
    assert rule["timeouts"] == {"request": "600s"}


def test_engines_admit_the_picker(helm: str) -> None:
    objects = template(helm, *ON)
    policy = only(objects, "NetworkPolicy", "-engines")
    picker_pod = deployment(objects, "picker")["spec"]["template"]["metadata"]["labels"]
    selectors = [peer["podSelector"]["matchLabels"] for peer in policy["spec"]["ingress"][0]["from"]
                 if "podSelector" in peer]  # fmt: skip
    assert any(s.items() <= picker_pod.items() for s in selectors)


def sets(*values: str) -> list[str]:
    return [item for value in values for item in ("--set", value)]


def picker_args(objects: list[Manifest]) -> list[str]:
    args: list[str] = container(deployment(objects, "picker"))["args"]
    return args


def test_the_picker_takes_the_gateways_tenants(helm: str) -> None:
    # The generated key (auth on by default): the same Secret, mounted as the gateway mounts
    # it, so a client's key works through the Gateway as at the gateway.
    objects = template(helm, *ON)
    picker, gateway = deployment(objects, "picker"), deployment(objects, "gateway")
    args = parse_laneway(picker_args(objects))
    assert args.tenants == "/etc/laneway/tenants"
    assert tenants_volume(picker) == tenants_volume(gateway)
    assert tenants_volume(picker)["secret"]["secretName"] == f"{RELEASE}-laneway-api-key"
    assert (args.tenant_max_concurrent, args.tenant_max_queued) == (None, None)
    assert args.tenant_max_concurrent_prompt_tokens is None
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(picker, version, strict=True)

    own = template(helm, *ON, *sets("gateway.tenants.existingSecret=acme-tenants",
                                    "gateway.tenants.maxConcurrentRequests=4",
                                    "gateway.tenants.maxQueuedRequests=16",
                                    "gateway.tenants.maxConcurrentPromptTokens=8192"))  # fmt: skip
    args = parse_laneway(picker_args(own))
    assert tenants_volume(deployment(own, "picker"))["secret"] == {"secretName": "acme-tenants"}
    assert (args.tenant_max_concurrent, args.tenant_max_queued) == (4, 16)
    assert args.tenant_max_concurrent_prompt_tokens == 8192

    # Auth off: every request anonymous, as at the gateway; no Secret mounted.
    off = deployment(template(helm, *ON, *sets("gateway.auth.enabled=false")), "picker")
    assert parse_laneway(container(off)["args"]).tenants is None
    assert "tenants" not in {v["name"] for v in off["spec"]["template"]["spec"]["volumes"]}
    assert "tenants" not in {m["name"] for m in container(off)["volumeMounts"]}


@pytest.mark.parametrize(
    "values",
    [
        ["redis.enabled=true"],
        ["redis.url=rediss://redis.cache:6380/0", "redis.auth.existingSecret=redis-credentials"],
    ],
)
def test_the_picker_shares_the_gateways_redis(helm: str, values: list[str]) -> None:
    objects = template(helm, *ON, *sets(*values, "picker.replicaCount=2"))
    picker = env_of(deployment(objects, "picker"))
    gateway = env_of(deployment(objects, "gateway"))
    names = ("LANEWAY_REDIS_URL", "LANEWAY_REDIS_PASSWORD")  # --redis-url's defaults
    assert {n: picker[n] for n in names} == {n: gateway[n] for n in names}
    assert deployment(objects, "picker")["spec"]["replicas"] == 2
    if values == ["redis.enabled=true"]:
        # The bundled Redis admits the picker's pods beside the gateway's.
        policy = only(objects, "NetworkPolicy", "-redis")
        pod = deployment(objects, "picker")["spec"]["template"]["metadata"]["labels"]
        peers = [
            peer["podSelector"]["matchLabels"] for peer in policy["spec"]["ingress"][0]["from"]
        ]
        assert any(peer.items() <= pod.items() for peer in peers)


def test_without_redis_the_picker_keeps_its_state_in_memory(helm: str) -> None:
    assert "env" not in container(deployment(template(helm, *ON), "picker"))


def test_the_picker_may_trust_the_gateways_fairness_id(helm: str) -> None:
    assert parse_laneway(picker_args(template(helm, *ON))).trust_fairness_id is False
    trusting = template(helm, *ON, *sets("picker.trustFairnessId=true"))
    assert parse_laneway(picker_args(trusting)).trust_fairness_id is True


def test_the_picker_reads_the_objectives_of_its_values(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "objectives.yaml"
    values.write_text("picker:\n  objectives:\n    premium: 5\n    best-effort: -2\n    plain: 0\n")
    objects = template(helm, *ON, "-f", str(values))
    args = parse_laneway(picker_args(objects))
    mount = next(m for m in container(deployment(objects, "picker"))["volumeMounts"]
                 if m["name"] == "config")  # fmt: skip
    assert args.objectives == f"{mount['mountPath']}/objectives.yaml"
    written = tmp_path / "mounted.yaml"
    written.write_text(only(objects, "ConfigMap", "-picker")["data"]["objectives.yaml"])
    read = load_objectives(written)
    assert dict(read.priorities) == {"premium": 5, "best-effort": -2, "plain": 0}

    # Read at start: another objective rolls the pods.
    def checksum(objects: list[Manifest]) -> str:
        annotations = deployment(objects, "picker")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    changed = template(helm, *ON, "-f", str(values), *sets("picker.objectives.premium=6"))
    assert checksum(changed) != checksum(objects)
    none = template(helm, *ON)
    assert parse_laneway(picker_args(none)).objectives is None
    assert "objectives.yaml" not in only(none, "ConfigMap", "-picker")["data"]


def test_the_picker_may_watch_the_clusters_objectives(helm: str) -> None:
    assert parse_laneway(picker_args(template(helm, *ON))).watch_objectives is False
    watching = parse_laneway(picker_args(template(helm, *ON, *sets("picker.watchObjectives=true"))))
    assert watching.watch_objectives is True
    assert watching.objectives is None


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (["picker.failureMode=Sometimes"], "/picker/failureMode"),
        (["picker.metricsPort=9002"], "/picker/metricsPort"),
        (["picker.httpRoute.requestTimeout=ten"], "/picker/httpRoute/requestTimeout"),
        (["picker.trustFairnessId=yes"], "/picker/trustFairnessId"),
        (["picker.objectives.premium=high"], "/picker/objectives/premium"),
        (["picker.objectives.Premium_Tier=1"], "additional properties 'Premium_Tier'"),
        (["picker.replicaCount=2"], "picker.replicaCount (2) needs shared state"),
        (["picker.watchObjectives=yes"], "/picker/watchObjectives"),
        (
            ["picker.watchObjectives=true", "picker.objectives.premium=5"],
            "picker.watchObjectives takes the objectives from the cluster",
        ),
        (
            ["picker.trustFairnessId=true", "gateway.auth.enabled=false"],
            "picker.trustFairnessId lets the fairness id name a tenant",
        ),
        *(
            (
                [f"gateway.tenants.{cap}=4", "gateway.auth.enabled=false"],
                f"gateway.tenants.{cap} caps each tenant of the tenants file",
            )
            for cap in ("maxConcurrentRequests", "maxQueuedRequests", "maxConcurrentPromptTokens")
        ),
    ],
)
def test_bad_picker_values_are_refused(helm: str, values: list[str], complaint: str) -> None:
    flags = [item for value in values for item in ("--set", value)]
    result = run_helm(helm, "template", RELEASE, str(CHART), *ON, *flags)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_helm_lint_passes_in_picker_mode(helm: str) -> None:
    result = run_helm(helm, "lint", str(CHART), *ON, "--strict")
    assert result.returncode == 0, result.stdout + result.stderr


def test_notes_say_how_to_address_each_inference_pool(helm: str) -> None:
    result = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--dry-run=client", *ON)  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} get lwpool        (or inferencepools.laneway.io)" in notes
    assert (
        f"kubectl -n {NAMESPACE} get infpool       (or inferencepools.inference.networking.k8s.io)"
    ) in notes
    assert "get inferencepools\n" not in notes, "ambiguous where both CRDs are installed"
    assert f"Service {PICKER}, port 9002" in notes
    assert f"HTTPRoute\n{RELEASE}-laneway-laneway-demo sends" in notes


def notes(helm: str, *values: str) -> str:
    result = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--dry-run=client", *ON, *sets(*values))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_list_the_pickers_options(helm: str) -> None:
    default = notes(helm)
    assert f"tenants:      the API keys of Secret {RELEASE}-laneway-api-key (--tenants)" in default
    assert "tenant caps:  none" in default
    assert "shared state: in memory, one replica" in default
    assert "fairness id:  names no tenant, the API key does" in default
    assert "objectives:   none" in default
    every = notes(
        helm,
        *("redis.enabled=true", "picker.trustFairnessId=true"),
        *("picker.objectives.premium=5", "picker.objectives.best-effort=-2"),
        *("gateway.tenants.existingSecret=acme", "gateway.tenants.maxQueuedRequests=16"),
        "gateway.tenants.maxConcurrentPromptTokens=8192",
    )
    assert "tenants:      the API keys of Secret acme (--tenants)" in every
    assert (
        "tenant caps:  no cap running, 16 waiting, 8192 prompt tokens running per tenant and pool"
    ) in every
    assert f"shared state: Redis redis://{RELEASE}-laneway-redis:6379/0 (--redis-url)" in every
    assert "fairness id:  names the tenant (picker.trustFairnessId)" in every
    assert "objectives:   best-effort=-2 premium=5 (--objectives)" in every
    watching = notes(helm, "picker.watchObjectives=true")
    assert "objectives:   the cluster's InferenceObjectives, watched" in watching
    anonymous = notes(helm, "gateway.auth.enabled=false")
    assert "tenants:      none, every request is anonymous" in anonymous
    assert "fairness id:  only splits the fair share" in anonymous
