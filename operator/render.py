"""Pure rendering of an InferencePool into the objects that run it.

`render_pool` is what the operator applies and what `laneway render` prints: an engine
Deployment (unless the pool adopts pods with `selector`), a Service named after the pool
with a port named `http`, and a PodDisruptionBudget. An autoscaling pool is scaled by the
operator through the pool's scale subresource (`laneway.autoscale`), so the Deployment always
runs `spec.replicas`. No I/O, no clock: the same pool always renders the same manifests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway import __version__
from laneway.api import (
    API_VERSION,
    KIND,
    POOL_LABEL,
    EngineKind,
    InferencePool,
    KVEventsSpec,
    SchedulingPolicy,
    SimulatorSpec,
)
from laneway.kube.client import FIELD_MANAGER, Manifest
from laneway.kube.endpoints import PORT_NAME
from laneway.operator.access import Refusal, secret_refusal, selector_refusal
from laneway.operator.images import image_refusal
from laneway.operator.upstream import PickerRef, model_labels

MANAGED_BY = FIELD_MANAGER  # the operator's name: on its children, and as their field manager
HEALTH_PATH = "/health"  # vLLM, SGLang and the simulator all answer here

DEFAULT_IMAGES: Mapping[EngineKind, str] = {
    EngineKind.VLLM: "vllm/vllm-openai:v0.11.0",
    EngineKind.SGLANG: "lmsysorg/sglang:v0.5.4",
    EngineKind.SIMULATOR: f"laneway:{__version__}",
}

# The queue-depth metric each engine serves; the HPA reads it through a metrics adapter.

# Kinds the operator may create for a pool, in apply order; whatever a pool no longer
# renders is deleted (HorizontalPodAutoscaler: what earlier versions rendered for
# spec.autoscaling, pruned on upgrade).
CHILD_KINDS = ("Service", "Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler")

_GPU_ENGINES = (EngineKind.VLLM, EngineKind.SGLANG)
_GPU_DEFAULT_RESOURCES: Mapping[str, Any] = {"limits": {"nvidia.com/gpu": "1"}}
_SIMULATOR_DEFAULT_RESOURCES: Mapping[str, Any] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
_NON_ROOT_UID = 10001  # the laneway image's user; any non-root uid suits the engine images
# The root filesystem is read-only, so whatever an engine writes goes to an emptyDir:
# - ~ (HOME=/cache): weights under HF_HOME, and the caches vLLM and SGLang keep under
#   ~/.cache, ~/.config and ~/.triton (vllm/envs.py: VLLM_CACHE_ROOT defaults to
#   ~/.cache/vllm, VLLM_CONFIG_ROOT to ~/.config/vllm; Triton, FlashInfer and torch.compile
#   caches sit beside them);
# - /tmp: ZMQ IPC sockets (vLLM's VLLM_RPC_BASE_PATH defaults to tempfile.gettempdir();
#   SGLang's PortArgs name them with tempfile) and TorchInductor's kernels;
# - /dev/shm: NCCL buffers for tensor parallelism.
# USER, because the uid has no /etc/passwd entry in the engine images: TorchInductor names
# its cache dir with getpass.getuser(), which raises without it (pytorch/pytorch#140765,
# vllm-project/vllm#44548) and stops the engine at import.
_GPU_SCRATCH_ENV: tuple[Mapping[str, str], ...] = (
    {"name": "HOME", "value": "/cache"},
    {"name": "HF_HOME", "value": "/cache/hf"},
    {"name": "USER", "value": "engine"},
)
# The pod's IP, from the downward API, for the KV events topic: Kubernetes expands $(NAME)
# in a container's args from its env. Named apart from a POD_IP that engine.env may set.
POD_IP_ENV = "LANEWAY_POD_IP"
_POD_IP_VAR: Mapping[str, Any] = {
    "name": POD_IP_ENV,
    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
}
# The simulator writes nothing; a GPU engine's /tmp holds compiled kernels of a size no one
# bounds, and an emptyDir over its sizeLimit gets the pod evicted, so only it is unbounded.
_SIMULATOR_TMP: Mapping[str, str] = {"sizeLimit": "64Mi"}


@dataclass(frozen=True)
class RenderOptions:
    """Operator-wide settings: default images per engine kind (overridable per pool), the
    registries engine images must come from (empty: any), and the Secrets engine env may
    read (empty: none)."""

    images: Mapping[EngineKind, str] = field(default_factory=lambda: dict(DEFAULT_IMAGES))
    allowed_image_prefixes: tuple[str, ...] = ()
    allowed_env_secrets: tuple[str, ...] = ()
    # Set: upstream InferencePools select engine pods by their models (operator/upstream.py).
    picker: PickerRef | None = None


@dataclass(frozen=True)
class EngineCommand:
    command: tuple[str, ...]  # the container's entrypoint
    args: tuple[str, ...]  # flags rendered from the spec, then the pool's engine.args

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command + self.args


@dataclass(frozen=True)
class RenderedPool:
    engine: EngineCommand
    children: tuple[Manifest, ...]  # in CHILD_KINDS order

    def child(self, kind: str) -> Manifest | None:
        return next((c for c in self.children if c["kind"] == kind), None)


def engine_command(pool: InferencePool) -> EngineCommand:
    """The engine's command line: spec knobs mapped onto each engine's own flags."""
    spec = pool.spec
    prefill, limits = spec.prefill, spec.limits
    priority = spec.scheduling.policy is SchedulingPolicy.PRIORITY
    if spec.engine.kind is EngineKind.VLLM:
        command: tuple[str, ...] = ("vllm", "serve")
        args = [
            spec.model,
            *("--served-model-name", spec.served_model_name),
            *("--host", "0.0.0.0"),
            *("--port", str(spec.port)),
            *("--max-model-len", str(limits.max_context_tokens)),
            *("--max-num-seqs", str(limits.max_concurrent_requests)),
            *("--max-num-batched-tokens", str(prefill.token_budget)),
            *("--scheduling-policy", spec.scheduling.policy.value),
            # `usage.prompt_tokens_details.cached_tokens` in every answer: how much of the
            # prompt the prefix cache held, which the gateway's count of prefill computed
            # twice after a reclaim reads (gateway/serving/recompute.py).
            "--enable-prompt-tokens-details",
        ]
        # No --max-num-partial-prefills: V1 refuses any value but its default at start-up,
        # and v0.27 removed the flag (spec validation keeps maxPartialPrefills at 1).
        if prefill.chunked_prefill:
            args += [
                "--enable-chunked-prefill",
                *("--long-prefill-token-threshold", str(prefill.chunk_size)),
            ]
        else:
            args.append("--no-enable-chunked-prefill")
    elif spec.engine.kind is EngineKind.SGLANG:
        command = ("python3", "-m", "sglang.launch_server")
        args = [
            *("--model-path", spec.model),
            *("--served-model-name", spec.served_model_name),
            *("--host", "0.0.0.0"),
            *("--port", str(spec.port)),
            *("--context-length", str(limits.max_context_tokens)),
            *("--max-running-requests", str(limits.max_concurrent_requests)),
            *("--max-prefill-tokens", str(prefill.token_budget)),
            # -1 is SGLang's way to turn chunked prefill off.
            *("--chunked-prefill-size", str(prefill.chunk_size if prefill.chunked_prefill else -1)),
            "--enable-metrics",
            "--enable-cache-report",  # SGLang's --enable-prompt-tokens-details (above)
        ]
        if prefill.chunked_prefill:
            # Without it SGLang runs prefill chunks and decodes in separate steps, and a
            # long prompt still pauses every stream for the length of its chunks.
            args.append("--enable-mixed-chunk")
        if priority:
            # Lower values first, as vLLM orders them, so one request field means the same
            # on both engines. SGLang applies priority order only under the fcfs and lof
            # policies (SchedulePolicy.calc_priority), so the policy is pinned to fcfs.
            args += [
                *("--schedule-policy", "fcfs"),
                "--enable-priority-scheduling",
                "--schedule-low-priority-values-first",
            ]
    else:
        simulator = spec.engine.simulator or SimulatorSpec()
        command = ("laneway",)
        args = [
            "sim",
            *("--host", "0.0.0.0"),
            *("--port", str(spec.port)),
            *("--model", spec.served_model_name),
            *("--profile", simulator.profile),
            *("--scheduler", "chunked" if prefill.chunked_prefill else "full"),
            *("--token-budget", str(prefill.token_budget)),
            *("--chunk-size", str(prefill.chunk_size)),
            *("--max-context", str(limits.max_context_tokens)),
            *("--max-num-seqs", str(limits.max_concurrent_requests)),
            *("--max-partial-prefills", str(prefill.max_partial_prefills)),
            *("--scheduling-policy", spec.scheduling.policy.value),
            *("--metrics-flavor", simulator.metrics_flavor.value),
            *("--time-scale", f"{simulator.time_scale:g}"),
        ]
    if spec.engine.kv_events is not None:
        args += _kv_events_flags(spec.engine.kv_events, spec.port, spec.engine.kind)
    return EngineCommand(command=command, args=(*args, *spec.engine.args))


def _kv_events_flags(kv_events: KVEventsSpec, port: int, kind: EngineKind) -> list[str]:
    """vLLM's --kv-events-config (`laneway sim` takes the same), publishing to the gateway's
    SUB socket under the topic `kv@<pod IP>:<port>`: the host:port of the endpoint URL the
    gateway routes to, which is how it tells whose events a message carries."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # Without `*` the engine connects, as every engine of the pool must to one socket.
        "endpoint": kv_events.endpoint,
        "topic": f"kv@$({POD_IP_ENV}):{port}",
    }
    flags = ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
    if kind is EngineKind.VLLM:
        # Pinned, so that the blocks the events describe are the gateway's blockSize
        # whatever default the attention backend would pick.
        flags += ["--block-size", str(kv_events.block_size)]
    return flags


def pool_labels(pool: InferencePool) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "laneway-engine",
        "app.kubernetes.io/instance": pool.name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        POOL_LABEL: pool.name,
        "laneway.io/lane": pool.spec.lane.value,
        "laneway.io/engine": pool.spec.engine.kind.value,
    }


def _pod_labels(pool: InferencePool, options: RenderOptions) -> dict[str, str]:
    """A pod's labels: its pool's, and with a picker its models' (never in the Deployment's
    selector, which cannot change)."""
    labels = pool_labels(pool)
    if options.picker is not None:
        labels.update(model_labels(pool))
    return labels


def pod_selector(pool: InferencePool) -> dict[str, str]:
    """Labels that pick the pool's engine pods: its own, or the adopted ones."""
    if pool.spec.selector is not None:
        return dict(pool.spec.selector)
    return {POOL_LABEL: pool.name}


def selector_string(pool: InferencePool) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(pod_selector(pool).items()))


def engine_image(pool: InferencePool, options: RenderOptions) -> str:
    return pool.spec.engine.image or options.images[pool.spec.engine.kind]


def refused_image(pool: InferencePool, options: RenderOptions) -> str | None:
    """Why the operator must not run this pool's engine image, or None when it may. A pool
    that adopts pods (`selector`) runs no image of the operator's."""
    if pool.spec.selector is not None:
        return None
    return image_refusal(engine_image(pool, options), options.allowed_image_prefixes)


def refusal(pool: InferencePool, options: RenderOptions) -> Refusal | None:
    """Why the operator (and `laneway render`) must not run this pool as written, or None:
    an image outside the allowed registries, a Secret outside the allowed ones, a selector
    that adopts pods which never opted in (operator/access.py)."""
    image = refused_image(pool, options)
    if image is not None:
        return Refusal(reason="ImageNotAllowed", message=image)
    return secret_refusal(pool, options.allowed_env_secrets) or selector_refusal(pool)


def render_pool(pool: InferencePool, options: RenderOptions | None = None) -> RenderedPool:
    options = options or RenderOptions()
    engine = engine_command(pool)
    children = [_service(pool)]
    if pool.spec.selector is None:
        children.append(_deployment(pool, engine, options))
    children.append(_disruption_budget(pool))
    return RenderedPool(engine=engine, children=tuple(children))


def _metadata(pool: InferencePool) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": pool.name,
        "namespace": pool.namespace,
        "labels": pool_labels(pool),
    }
    if pool.uid:  # offline renders have no owner to point at
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": pool.name,
                "uid": pool.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return metadata


def _service(pool: InferencePool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(pool),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": pool.spec.port,
                    # A number, not the port's name: adopted pods may not name theirs.
                    "targetPort": pool.spec.port,
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def _disruption_budget(pool: InferencePool) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pool),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": pod_selector(pool)},
            # A crash-looping engine must not block node drains.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _health_probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def _resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    """Quantities as strings, the form the API server returns them in."""
    return {
        section: {name: str(quantity) for name, quantity in amounts.items()}
        if isinstance(amounts, Mapping)
        else amounts
        for section, amounts in resources.items()
    }


def _deployment(pool: InferencePool, engine: EngineCommand, options: RenderOptions) -> Manifest:
    spec = pool.spec
    gpu = spec.engine.kind in _GPU_ENGINES
    container = _engine_container(pool, engine, options, gpu)
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": pod_selector(pool)},
        # GPU clusters rarely have a spare GPU to surge into: replace one replica at a time.
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}
            if gpu
            else {"maxSurge": 1, "maxUnavailable": 0},
        },
        "progressDeadlineSeconds": 1800 if gpu else 300,
        "revisionHistoryLimit": 3,
        "template": {
            "metadata": {"labels": _pod_labels(pool, options)},
            "spec": _pod_spec(pool, container, gpu),
        },
        "replicas": spec.replicas,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pool),
        "spec": deployment_spec,
    }


def _engine_container(
    pool: InferencePool, engine: EngineCommand, options: RenderOptions, gpu: bool
) -> dict[str, Any]:
    spec = pool.spec
    default_resources = _GPU_DEFAULT_RESOURCES if gpu else _SIMULATOR_DEFAULT_RESOURCES
    env: list[Mapping[str, Any]] = []
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if gpu:
        env += list(_GPU_SCRATCH_ENV)
        mounts += [
            {"name": "cache", "mountPath": "/cache"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ]
    if spec.engine.kv_events is not None:
        env.append(_POD_IP_VAR)
    env += list(spec.engine.env)
    container: dict[str, Any] = {
        "name": "engine",
        "image": engine_image(pool, options),
        "imagePullPolicy": "IfNotPresent",
        "command": list(engine.command),
        "args": list(engine.args),
        "ports": [{"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}],
        "resources": _resources(spec.engine.resources or default_resources),
        # Loading weights takes minutes on a GPU engine; the simulator starts at once.
        "startupProbe": _health_probe(period=10 if gpu else 1, failures=180 if gpu else 60),
        "readinessProbe": _health_probe(period=5, failures=2),
        "livenessProbe": _health_probe(period=10, failures=3),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,  # scratch is on the emptyDirs of _pod_spec
        },
        "volumeMounts": mounts,
    }
    if env:
        container["env"] = env
    return container


def _pod_spec(pool: InferencePool, container: dict[str, Any], gpu: bool) -> dict[str, Any]:
    spec = pool.spec
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # engines never call the API
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,  # let running streams finish
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": _NON_ROOT_UID,
            "runAsGroup": _NON_ROOT_UID,
            "fsGroup": _NON_ROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    pod_spec["volumes"] = [{"name": "tmp", "emptyDir": {} if gpu else dict(_SIMULATOR_TMP)}]
    if gpu:
        pod_spec["volumes"] += [
            {"name": "cache", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
        ]
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.affinity:
        pod_spec["affinity"] = dict(spec.affinity)
    return pod_spec
