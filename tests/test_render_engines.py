"""Rendering: spec -> engine flags for each engine, and every rendered object valid against
the upstream Kubernetes OpenAPI schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from typing import Any

import kubernetes_validate
import pytest
from support.crd import example_documents
from support.pools import spec_pool

from laneway import api
from laneway.api import POOL_LABEL
from laneway.bench.harness.procs import Children
from laneway.cli import build_parser
from laneway.operator.render import (
    DEFAULT_IMAGES,
    RenderOptions,
    engine_command,
    render_pool,
)

KNOBS = {
    "port": 9000,
    "prefill": {"chunkSize": 512, "tokenBudget": 4096, "maxPartialPrefills": 2},
    "limits": {"maxContextTokens": 16384, "maxConcurrentRequests": 128},
}

# (case, spec, the engine's full argv)
TABLE: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "vLLM, chunked, priority scheduling (no partial-prefill flag: V1 refuses it)",
        {**KNOBS, "prefill": {"chunkSize": 512, "tokenBudget": 4096},
         "scheduling": {"policy": "priority"},
         "engine": {"kind": "vllm", "args": ["--enable-prefix-caching"]}},
        ["vllm", "serve", "org/model", "--served-model-name", "m", "--host", "0.0.0.0",
         "--port", "9000", "--max-model-len", "16384", "--max-num-seqs", "128",
         "--max-num-batched-tokens", "4096", "--scheduling-policy", "priority",
         "--enable-prompt-tokens-details",
         "--enable-chunked-prefill", "--long-prefill-token-threshold", "512",
         "--enable-prefix-caching"],
    ),
    (
        "vLLM, whole prefills",
        {
            "engine": {"kind": "vllm"},
            "prefill": {"chunkedPrefill": False, "tokenBudget": 8192},
            "limits": {"maxContextTokens": 8192},
        },
        ["vllm", "serve", "org/model", "--served-model-name", "m", "--host", "0.0.0.0",
         "--port", "8000", "--max-model-len", "8192", "--max-num-seqs", "256",
         "--max-num-batched-tokens", "8192", "--scheduling-policy", "fcfs",
         "--enable-prompt-tokens-details",
         "--no-enable-chunked-prefill"],
    ),
    (
        "vLLM publishing KV events to the gateway, topic the pod's endpoint, blocks pinned",
        {"engine": {"kind": "vllm", "kvEvents": {
            "endpoint": "tcp://laneway-gateway-kv-events.laneway.svc:5557", "blockSize": 32}}},
        ["vllm", "serve", "org/model", "--served-model-name", "m", "--host", "0.0.0.0",
         "--port", "8000", "--max-model-len", "8192", "--max-num-seqs", "256",
         "--max-num-batched-tokens", "2048", "--scheduling-policy", "fcfs",
         "--enable-prompt-tokens-details",
         "--enable-chunked-prefill", "--long-prefill-token-threshold", "1024",
         "--kv-events-config",
         '{"enable_kv_cache_events":true,"publisher":"zmq",'
         '"endpoint":"tcp://laneway-gateway-kv-events.laneway.svc:5557",'
         '"topic":"kv@$(LANEWAY_POD_IP):8000"}',
         "--block-size", "32"],
    ),
    (
        "SGLang, chunked",
        {**KNOBS, "prefill": {"chunkSize": 1024, "tokenBudget": 2048},
         "engine": {"kind": "sglang", "args": ["--tp-size", "2"]}},
        ["python3", "-m", "sglang.launch_server", "--model-path", "org/model",
         "--served-model-name", "m", "--host", "0.0.0.0", "--port", "9000",
         "--context-length", "16384", "--max-running-requests", "128",
         "--max-prefill-tokens", "2048", "--chunked-prefill-size", "1024", "--enable-metrics",
         "--enable-cache-report", "--enable-mixed-chunk", "--tp-size", "2"],
    ),
    (
        "SGLang, priority scheduling with vLLM's order (lower first)",
        {"engine": {"kind": "sglang"}, "scheduling": {"policy": "priority"}},
        ["python3", "-m", "sglang.launch_server", "--model-path", "org/model",
         "--served-model-name", "m", "--host", "0.0.0.0", "--port", "8000",
         "--context-length", "8192", "--max-running-requests", "256",
         "--max-prefill-tokens", "2048", "--chunked-prefill-size", "1024", "--enable-metrics",
         "--enable-cache-report", "--enable-mixed-chunk", "--schedule-policy", "fcfs",
         "--enable-priority-scheduling", "--schedule-low-priority-values-first"],
    ),
    (
        "SGLang, whole prefills",
        {"engine": {"kind": "sglang"}, "prefill": {"chunkedPrefill": False}},
        ["python3", "-m", "sglang.launch_server", "--model-path", "org/model",
         "--served-model-name", "m", "--host", "0.0.0.0", "--port", "8000",
         "--context-length", "8192", "--max-running-requests", "256",
         "--max-prefill-tokens", "2048", "--chunked-prefill-size", "-1", "--enable-metrics",
         "--enable-cache-report"],
    ),
    (
        "simulator, chunked, sped up, SGLang metrics",
        {**KNOBS, "engine": {"kind": "simulator", "simulator": {
            "profile": "h200-llama3-8b", "timeScale": 10, "metricsFlavor": "sglang"}}},
        ["laneway", "sim", "--host", "0.0.0.0", "--port", "9000", "--model", "m",
         "--profile", "h200-llama3-8b", "--scheduler", "chunked", "--token-budget", "4096",
         "--chunk-size", "512", "--max-context", "16384", "--max-num-seqs", "128",
         "--max-partial-prefills", "2", "--scheduling-policy", "fcfs",
         "--metrics-flavor", "sglang", "--time-scale", "10"],
    ),
    (
        "simulator, priority scheduling",
        {"engine": {"kind": "simulator"}, "scheduling": {"policy": "priority"}},
        ["laneway", "sim", "--host", "0.0.0.0", "--port", "8000", "--model", "m",
         "--profile", "h200-llama3-8b", "--scheduler", "chunked", "--token-budget", "2048",
         "--chunk-size", "1024", "--max-context", "8192", "--max-num-seqs", "256",
         "--max-partial-prefills", "1", "--scheduling-policy", "priority",
         "--metrics-flavor", "vllm", "--time-scale", "1"],
    ),
    (
        "simulator publishing KV events (its blocks are 16 tokens: no --block-size)",
        {"engine": {"kind": "simulator", "kvEvents": {"endpoint": "tcp://10.96.0.12:5557"}},
         "port": 9000},
        ["laneway", "sim", "--host", "0.0.0.0", "--port", "9000", "--model", "m",
         "--profile", "h200-llama3-8b", "--scheduler", "chunked", "--token-budget", "2048",
         "--chunk-size", "1024", "--max-context", "8192", "--max-num-seqs", "256",
         "--max-partial-prefills", "1", "--scheduling-policy", "fcfs",
         "--metrics-flavor", "vllm", "--time-scale", "1", "--kv-events-config",
         '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://10.96.0.12:5557",'
         '"topic":"kv@$(LANEWAY_POD_IP):9000"}'],
    ),
    (
        "simulator defaults, whole prefills",
        {"engine": {"kind": "simulator"}, "prefill": {"chunkedPrefill": False}},
        ["laneway", "sim", "--host", "0.0.0.0", "--port", "8000", "--model", "m",
         "--profile", "h200-llama3-8b", "--scheduler", "full", "--token-budget", "2048",
         "--chunk-size", "1024", "--max-context", "8192", "--max-num-seqs", "256",
         "--max-partial-prefills", "1", "--scheduling-policy", "fcfs",
         "--metrics-flavor", "vllm", "--time-scale", "1"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spec", "argv"), TABLE, ids=[t[0] for t in TABLE])
def test_engine_flags(case: str, spec: dict[str, Any], argv: list[str]) -> None:
    rendered = render_pool(spec_pool(spec))
    assert list(rendered.engine.argv) == argv, case
    deployment = rendered.child("Deployment")
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] + container["args"] == argv


@pytest.mark.parametrize("spec", [t[1] for t in TABLE if t[1]["engine"]["kind"] == "simulator"])
def test_simulator_flags_are_accepted_by_laneway_sim(spec: dict[str, Any]) -> None:
    argv = engine_command(spec_pool(spec)).argv
    parsed = build_parser().parse_args(list(argv[1:]))
    assert parsed.command == "sim"
    assert parsed.port == int(argv[argv.index("--port") + 1])
    assert parsed.token_budget == int(argv[argv.index("--token-budget") + 1])
    assert parsed.scheduling_policy == argv[argv.index("--scheduling-policy") + 1]


def _all_rendered() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for document in example_documents():
        document = copy.deepcopy(document)
        document["metadata"]["uid"] = "9a1c6f0e-0000-4000-8000-000000000001"
        objects += render_pool(api.parse_pool(document)).children
    for _, spec, _ in TABLE:
        objects += render_pool(spec_pool(spec, uid="uid-1")).children
    objects += render_pool(spec_pool({"engine": {"kind": "vllm"}, "selector": {
        "matchLabels": {"app": "existing-vllm"}}})).children  # fmt: skip
    return objects


@pytest.mark.parametrize(
    "manifest", _all_rendered(), ids=lambda m: f"{m['kind']}/{m['metadata']['name']}"
)
def test_rendered_objects_pass_the_upstream_kubernetes_schemas(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, "1.37", strict=True)


def test_children_are_owned_labelled_and_named_after_the_pool() -> None:
    rendered = render_pool(spec_pool({"engine": {"kind": "vllm"}}, name="realtime", uid="u-1"))
    assert [c["kind"] for c in rendered.children] == [
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ]
    for child in rendered.children:
        metadata = child["metadata"]
        assert (metadata["name"], metadata["namespace"]) == ("realtime", "serving")
        assert metadata["labels"][POOL_LABEL] == "realtime"
        assert metadata["ownerReferences"] == [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": "realtime",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    service = rendered.child("Service")
    assert service is not None
    assert service["spec"]["selector"] == {POOL_LABEL: "realtime"}
    assert service["spec"]["ports"][0]["name"] == "http"
    deployment = rendered.child("Deployment")
    assert deployment is not None
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[POOL_LABEL] == "realtime"
    assert deployment["spec"]["selector"]["matchLabels"] == {POOL_LABEL: "realtime"}


def test_offline_render_has_no_owner() -> None:
    for child in render_pool(spec_pool({"engine": {"kind": "simulator"}})).children:
        assert "ownerReferences" not in child["metadata"]


def test_gpu_engines_get_a_gpu_probes_and_a_non_root_pod() -> None:
    deployment = render_pool(spec_pool({"engine": {"kind": "vllm"}})).child("Deployment")
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == DEFAULT_IMAGES[api.EngineKind.VLLM]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


@pytest.mark.parametrize("kind", [k.value for k in api.EngineKind])
def test_every_engine_runs_read_only_with_its_scratch_on_empty_dirs(kind: str) -> None:
    deployment = render_pool(spec_pool({"engine": {"kind": kind}})).child("Deployment")
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounts.values()) <= empty_dirs
    assert "/tmp" in mounts  # the temp dir: IPC sockets, compiled kernels
    if kind == "simulator":
        return
    env = {e["name"]: e["value"] for e in container["env"]}
    # Every ~ path (caches of vLLM, SGLang, Triton, FlashInfer) and the weights land on a
    # writable volume; USER spares getpass.getuser() a uid missing from /etc/passwd.
    assert env["HOME"] in mounts
    assert env["HF_HOME"].startswith(env["HOME"] + "/")
    assert env["USER"]
    assert "/dev/shm" in mounts


def test_pool_image_resources_and_scheduling_pass_through() -> None:
    spec = {
        "engine": {
            "kind": "sglang",
            "image": "registry.local/sglang:dev",
            "resources": {"limits": {"nvidia.com/gpu": 2}},
            "env": [{"name": "HF_TOKEN", "value": "x"}],
        },
        "nodeSelector": {"gpu": "h200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
    }
    deployment = render_pool(spec_pool(spec)).child("Deployment")
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.local/sglang:dev"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert {"name": "HF_TOKEN", "value": "x"} in container["env"]
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["affinity"] == {"nodeAffinity": {}}


def test_operator_default_image_for_simulators() -> None:
    options = RenderOptions(images={**DEFAULT_IMAGES, api.EngineKind.SIMULATOR: "laneway:test"})
    deployment = render_pool(spec_pool({"engine": {"kind": "simulator"}}), options).child(
        "Deployment"
    )
    assert deployment is not None
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "laneway:test"


def test_selector_mode_adopts_pods_instead_of_a_deployment() -> None:
    spec = {"engine": {"kind": "vllm"}, "selector": {"matchLabels": {"app": "vllm"}}}
    rendered = render_pool(spec_pool(spec))
    assert rendered.child("Deployment") is None
    service, budget = rendered.child("Service"), rendered.child("PodDisruptionBudget")
    assert service is not None
    assert budget is not None
    assert service["spec"]["selector"] == {"app": "vllm"}
    assert budget["spec"]["selector"] == {"matchLabels": {"app": "vllm"}}


def test_autoscaling_renders_no_hpa_and_the_deployment_runs_spec_replicas() -> None:
    """The operator scales the pool itself (through spec.replicas, the scale subresource's
    path), so the Deployment follows spec.replicas and no metrics adapter is needed."""
    spec = {
        "engine": {"kind": "sglang"},
        "replicas": 3,
        "autoscaling": {"minReplicas": 2, "maxReplicas": 6},
    }
    rendered = render_pool(spec_pool(spec))
    assert [c["kind"] for c in rendered.children] == [
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ]
    deployment = rendered.child("Deployment")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 3


def test_rendering_is_deterministic() -> None:
    spec = {**KNOBS, "prefill": {"chunkSize": 512, "tokenBudget": 4096}, "engine": {"kind": "vllm"}}
    assert render_pool(spec_pool(spec, uid="u")) == render_pool(spec_pool(spec, uid="u"))


def test_a_rendered_simulator_pod_command_serves_its_pool() -> None:
    """Run the container's command line as the pod would (bound to loopback on a free port
    here) and check the engine serves the pool's model with the pool's context cap."""
    spec = {
        "servedModelName": "sim-chat",
        "engine": {"kind": "simulator", "simulator": {"profile": "zero", "timeScale": 100}},
        "limits": {"maxContextTokens": 2048},
        "prefill": {"chunkSize": 256, "tokenBudget": 512},
    }
    argv = list(engine_command(spec_pool(spec)).argv)
    assert argv[:2] == ["laneway", "sim"]
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = "0"
    with Children() as children:
        engine = children.start_laneway("sim", argv[2:])
        with urllib.request.urlopen(f"{engine.url}/health", timeout=10) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"{engine.url}/v1/models", timeout=10) as response:
            models = json.load(response)
        assert [m["id"] for m in models["data"]] == ["sim-chat"]
        too_long = json.dumps(
            {"model": "sim-chat", "prompt": "word " * 3000, "max_tokens": 4}
        ).encode()
        request = urllib.request.Request(
            f"{engine.url}/v1/completions",
            data=too_long,
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        caught.value.close()
        assert caught.value.code == 400
