"""Which engine images the operator may run: an allow-list of registries and repository
prefixes, so that whoever may create an InferencePool cannot make the operator run any image.

Names are compared in their full form, as container runtimes resolve them (the reference
grammar of the distribution project): a first component with a "." or ":" or that is
"localhost" names a registry; otherwise the image is on Docker Hub, `docker.io`, and a
one-component name there is under `library/`. A prefix is read the same way, except that
a path after an explicit registry is taken as written: `docker.io/vllm` is the `vllm`
namespace and admits `vllm/vllm-openai:v0.11.0`, while the bare `laneway` admits
`laneway:0.1.0` (`docker.io/library/laneway`).

A prefix matches whole components: `registry.example.com/team` admits
`registry.example.com/team/engine:1` and `registry.example.com/team:1`, never
`registry.example.com/team-b/engine:1`. An empty allow-list admits every image.
"""

from __future__ import annotations

from collections.abc import Sequence

DOCKER_HUB = "docker.io"
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
_COMPONENT_ENDS = "/:@"  # what may follow a matched prefix: a path, a tag, a digest


def _names_registry(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost"


def full_name(image: str) -> str:
    """`image` with its registry and, on Docker Hub, its `library/` namespace spelled out."""
    first, slash, rest = image.partition("/")
    if slash and _names_registry(first):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, image
    if registry in _DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    return f"{registry}/{path}"


def _full_prefix(prefix: str) -> str:
    trimmed = prefix.rstrip("/")
    first, slash, rest = trimmed.partition("/")
    if _names_registry(first):
        registry, path = first, rest  # a lone registry host admits everything it serves
    else:
        registry, path = DOCKER_HUB, trimmed
        if not slash and not prefix.endswith("/"):
            path = f"library/{path}"  # a bare name is an official image, as an image's is
    if registry in _DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
    return f"{registry}/{path}" if path else registry


def image_allowed(image: str, prefixes: Sequence[str]) -> bool:
    """True when `prefixes` is empty or one of them matches `image` on whole components."""
    if not prefixes:
        return True
    name = full_name(image)
    for prefix in prefixes:
        start = _full_prefix(prefix)
        if name == start or (name.startswith(start) and name[len(start)] in _COMPONENT_ENDS):
            return True
    return False


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be an allow-list entry, or None when it can."""
    if not prefix.strip("/"):
        return "must name a registry or repository, e.g. registry.example.com/inference"
    if prefix != prefix.strip() or any(c.isspace() for c in prefix):
        return "must not contain spaces"
    first, _, rest = prefix.partition("/")
    if any(c in (rest if _names_registry(first) else prefix) for c in ":@"):
        return "must be a registry or repository prefix without a tag or digest"
    return None


def image_refusal(image: str, prefixes: Sequence[str]) -> str | None:
    """The message a pool whose engine image is not allowed gets, or None when it is."""
    if image_allowed(image, prefixes):
        return None
    return (
        f"the engine image {image!r} is not in an allowed registry: this operator runs only "
        f"images under {', '.join(prefixes)}; set spec.engine.image to one of those, or have "
        "the operator's administrator add its registry (--allowed-image-prefix, the chart's "
        "operator.allowedImagePrefixes)"
    )
