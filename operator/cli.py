"""Command-line entry points of the operator: `laneway render FILE` and `laneway operator`."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laneway.api import KIND, EngineKind, InferencePool, SpecError, check_pool_set, parse_pool
from laneway.errors import UsageError

if TYPE_CHECKING:
    from laneway.operator.render import RenderOptions

GATEWAY_URL_ENV = "LANEWAY_GATEWAY_URL"


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `render` and `operator`."""
    render = commands.add_parser(
        "render",
        help="print the manifests the operator would create for the pools in FILE",
        description="Render every InferencePool in FILE (multi-document YAML; '-' reads stdin) "
        "into the Deployment, Service, PodDisruptionBudget and HorizontalPodAutoscaler the "
        "operator would apply, printed as YAML. Offline: the same code the operator runs.",
    )
    render.add_argument("file", metavar="FILE", help="YAML file of InferencePools, or '-'")
    add_image_flag(render)
    add_access_flags(render)
    add_picker_flags(render)
    render.set_defaults(handler=run_render)

    operator = commands.add_parser(
        "operator",
        help="run the operator that turns InferencePools into engine pods",
        description="Reconcile InferencePools into engine Deployments, Services and "
        "PodDisruptionBudgets. Uses the in-cluster service account, else $KUBECONFIG or "
        "~/.kube/config. Run one replica.",
    )
    operator.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: every namespace)",
    )
    operator.add_argument(
        "--health-port",
        type=int,
        default=8081,
        help="port of the liveness endpoint /healthz (default 8081)",
    )
    operator.add_argument(
        "--gateway-url",
        default=os.environ.get(GATEWAY_URL_ENV) or None,
        metavar="URL",
        help="the gateway's base URL (its Service), read every --demand-interval for each "
        "pool's demand: SLO attainment in the status, and spec.autoscaling applied "
        f"(default ${GATEWAY_URL_ENV}; unset: no autoscaling, no attainment)",
    )
    operator.add_argument(
        "--demand-interval",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often to read the gateway's demand and scale (default 15)",
    )
    add_image_flag(operator)
    add_access_flags(operator)
    add_picker_flags(operator)
    operator.set_defaults(handler=run_operator)


def add_image_flag(parser: argparse.ArgumentParser) -> None:
    kinds = ", ".join(k.value for k in EngineKind)
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="KIND=IMAGE",
        help=f"default engine image for a kind ({kinds}); repeatable",
    )


def add_access_flags(parser: argparse.ArgumentParser) -> None:
    """What pools may reach: the same flags on the operator and on `laneway render`, so an
    offline render refuses what the operator would."""
    parser.add_argument(
        "--allowed-image-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="run only engine images under this registry or repository prefix, matched on "
        "whole name components (e.g. registry.example.com/inference); repeatable; a pool "
        "with another image gets Ready=False and nothing is applied (default: any image)",
    )
    parser.add_argument(
        "--allowed-env-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret (in the pool's namespace) that spec.engine.env may read with "
        "valueFrom.secretKeyRef, e.g. a Hugging Face token; repeatable; a pool reading "
        "another gets Ready=False and nothing is applied (default: none)",
    )


def add_picker_flags(parser: argparse.ArgumentParser) -> None:
    """laneway's endpoint picker behind a Gateway (operator/upstream.py)."""
    parser.add_argument(
        "--picker-service",
        metavar="NAME",
        help="the Service of laneway's endpoint picker (`laneway epp`, gRPC port 9002) in "
        "each pool's namespace: where the Gateway API Inference Extension's CRD is "
        "installed, one inference.networking.k8s.io InferencePool per model selects that "
        "model's engine pods and names this picker (default: none rendered)",
    )
    parser.add_argument(
        "--picker-failure-mode",
        # operator/upstream.py's FailureMode, spelled here so the CLI starts without it.
        choices=("FailClose", "FailOpen"),
        default="FailClose",
        help="what the Gateway does while the picker does not answer: FailClose refuses "
        "requests, FailOpen sends them to an endpoint of its own choosing (default FailClose)",
    )


def render_options(args: argparse.Namespace, simulator_image: str | None = None) -> RenderOptions:
    """The RenderOptions the image and access flags describe."""
    from laneway.operator.render import RenderOptions
    from laneway.operator.upstream import FailureMode, PickerRef

    picker = None
    if args.picker_service is not None:
        if len(args.picker_service) > 63 or not _DNS_LABEL.fullmatch(args.picker_service):
            raise UsageError(
                f"--picker-service {args.picker_service!r}: must be a Service's name "
                "(lowercase letters, digits and '-', at most 63 characters)"
            )
        picker = PickerRef(
            service=args.picker_service, failure_mode=FailureMode(args.picker_failure_mode)
        )
    return RenderOptions(
        images=parse_images(args.image, simulator_image),
        allowed_image_prefixes=parse_allowed_prefixes(args.allowed_image_prefix),
        allowed_env_secrets=parse_allowed_secrets(args.allowed_env_secret),
        picker=picker,
    )


def parse_images(
    values: Sequence[str], simulator_image: str | None = None
) -> dict[EngineKind, str]:
    """Default images per kind: built-ins, then `simulator_image` (the operator's own
    image, from $LANEWAY_IMAGE), then --image flags."""
    from laneway.operator.render import DEFAULT_IMAGES

    images = dict(DEFAULT_IMAGES)
    if simulator_image:
        images[EngineKind.SIMULATOR] = simulator_image
    for value in values:
        kind, _, image = value.partition("=")
        if kind not in {k.value for k in EngineKind} or not image:
            choices = ", ".join(k.value for k in EngineKind)
            raise UsageError(f"--image {value!r}: expected KIND=IMAGE with KIND one of {choices}")
        images[EngineKind(kind)] = image
    return images


def parse_allowed_prefixes(values: Sequence[str]) -> tuple[str, ...]:
    from laneway.operator.images import prefix_problem

    for value in values:
        problem = prefix_problem(value)
        if problem is not None:
            raise UsageError(f"--allowed-image-prefix {value!r}: {problem}")
    return tuple(values)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def parse_allowed_secrets(values: Sequence[str]) -> tuple[str, ...]:
    for value in values:
        if len(value) > 253 or not _SECRET_NAME.fullmatch(value):
            raise UsageError(
                f"--allowed-env-secret {value!r}: must be a Secret's name (lowercase letters, "
                "digits, '-' and '.', at most 253 characters), e.g. hf-token"
            )
    return tuple(values)


def load_pools(text: str, source: str) -> list[InferencePool]:
    """Every InferencePool document in `text`, validated alone and as a set."""
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "cannot be parsed"
        raise UsageError(f"{source}: not valid YAML{where}: {problem}") from error
    pools = []
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise UsageError(f"{source}: document {index + 1} is not a mapping")
        if document.get("kind") != KIND:
            continue  # e.g. the gateway's GatewayConfig in the same file
        try:
            pools.append(parse_pool(document))
        except SpecError as error:
            name = (document.get("metadata") or {}).get("name", f"document {index + 1}")
            raise UsageError(f"{source}: InferencePool {name}: {error}") from error
    if not pools:
        raise UsageError(f"{source}: no {KIND} documents found")
    problems = check_pool_set(pools)
    if problems:
        raise UsageError(f"{source}: " + "; ".join(str(p) for p in problems))
    return pools


def run_render(args: argparse.Namespace) -> int:
    import yaml

    from laneway.operator.render import refusal, render_pool

    if args.file == "-":
        text, source = sys.stdin.read(), "stdin"
    else:
        path = Path(args.file)
        try:
            text, source = path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"cannot read {path}: {error}") from error
    options = render_options(args)
    documents = []
    pools = load_pools(text, source)
    for pool in pools:
        refused = refusal(pool, options)
        if refused is not None:
            raise UsageError(f"{source}: InferencePool {pool.key}: {refused.message}")
        rendered = render_pool(pool, options)
        header = f"# {KIND} {pool.key}: {' '.join(rendered.engine.argv)}\n"
        for index, child in enumerate(rendered.children):
            text = yaml.safe_dump(child, sort_keys=False)
            documents.append(header + text if index == 0 else text)
    if options.picker is not None:
        from laneway.operator.upstream import upstream_pools

        header = "# where inference.networking.k8s.io is installed: one pool per model\n"
        for index, upstream in enumerate(upstream_pools(pools, options.picker)):
            text = yaml.safe_dump(upstream, sort_keys=False)
            documents.append(header + text if index == 0 else text)
    sys.stdout.write("---\n".join(documents))
    return 0


def run_operator(args: argparse.Namespace) -> int:
    import kopf
    from kubernetes.config import ConfigException

    from laneway.kube.client import KubeApi
    from laneway.operator.handlers import OperatorState, registry

    if not 0 < args.health_port < 65536:
        raise UsageError(f"--health-port {args.health_port}: must be 1-65535")
    if not 1.0 <= args.demand_interval <= 3600:
        raise UsageError(f"--demand-interval {args.demand_interval}: must be 1-3600 seconds")
    if args.gateway_url is not None and not args.gateway_url.startswith(("http://", "https://")):
        raise UsageError(
            f"--gateway-url {args.gateway_url!r}: must start with http:// or https:// "
            "(e.g. http://laneway-gateway.laneway-system:8080)"
        )
    options = render_options(args, os.environ.get("LANEWAY_IMAGE"))
    try:
        cluster = KubeApi.from_environment()
    except ConfigException as error:
        raise UsageError(f"no Kubernetes configuration found: {error}") from error
    print("laneway operator: starting", file=sys.stderr, flush=True)
    kopf.run(
        registry=registry,
        standalone=True,  # one replica; no peering objects to create or RBAC to grant
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        memo=kopf.Memo(
            state=OperatorState(
                cluster=cluster,
                options=options,
                gateway_url=args.gateway_url,
                demand_interval_s=args.demand_interval,
                namespaces=tuple(args.namespace),
            )
        ),
    )
    return 0
