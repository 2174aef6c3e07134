"""The operator's allow-list of engine images: which names a prefix admits, which prefixes
are refused, and the message a pool outside the list gets."""

from __future__ import annotations

import pytest

from laneway import api
from laneway.operator.images import full_name, image_allowed, image_refusal, prefix_problem
from laneway.operator.render import DEFAULT_IMAGES, RenderOptions, refused_image

ALLOWED = ("registry.example.com/inference", "docker.io/vllm")

ADMITTED = [
    # (image, prefixes, allowed, why)
    ("vllm/vllm-openai:v0.11.0", ALLOWED, True, "Docker Hub shorthand of docker.io/vllm/..."),
    ("docker.io/vllm/vllm-openai:v0.11.0", ALLOWED, True, "the full name"),
    ("index.docker.io/vllm/vllm-openai", ALLOWED, True, "an alias of Docker Hub"),
    ("registry.example.com/inference/sglang:dev", ALLOWED, True, "under the prefix"),
    ("registry.example.com/inference:1", ALLOWED, True, "the prefix itself with a tag"),
    ("registry.example.com/inference@sha256:ab", ALLOWED, True, "the prefix with a digest"),
    ("registry.example.com/inference-evil/x:1", ALLOWED, False, "not a whole component"),
    ("registry.example.com.evil.io/inference/x", ALLOWED, False, "another registry"),
    ("lmsysorg/sglang:v0.5.4", ALLOWED, False, "another Docker Hub namespace"),
    ("evil.io/vllm/vllm-openai:v0.11.0", ALLOWED, False, "same path, another registry"),
    ("vllm:latest", ALLOWED, False, "docker.io/library/vllm, not docker.io/vllm/"),
    ("laneway:0.1.0", ("laneway",), True, "a one-component name is docker.io/library/..."),
    ("laneway-evil:0.1.0", ("laneway",), False, "not a whole component"),
    ("localhost:5000/engines/vllm", ("localhost:5000",), True, "a lone registry host"),
    ("localhost:5001/engines/vllm", ("localhost:5000",), False, "another port"),
    ("registry.example.com/a/b", ("registry.example.com/",), True, "a trailing slash"),
    ("vllm/vllm-openai:v0.11.0", ("vllm/",), True, "a Docker Hub namespace"),
    ("docker.io/library/vllm:1", ("docker.io/vllm",), False, "the vllm namespace, not library"),
    ("anything.io/at/all:1", (), True, "an empty list admits every image"),
]


@pytest.mark.parametrize(
    ("image", "prefixes", "allowed"), [case[:3] for case in ADMITTED], ids=[c[3] for c in ADMITTED]
)
def test_a_prefix_admits_whole_name_components(
    image: str, prefixes: tuple[str, ...], allowed: bool
) -> None:
    assert image_allowed(image, prefixes) is allowed


def test_full_names_spell_out_registry_and_library() -> None:
    assert full_name("redis") == "docker.io/library/redis"
    assert full_name("redis:7") == "docker.io/library/redis:7"
    assert full_name("bitnami/redis") == "docker.io/bitnami/redis"
    assert full_name("ghcr.io/org/img:1") == "ghcr.io/org/img:1"
    assert full_name("localhost/img") == "localhost/img"


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ("", "must name a registry or repository"),
        ("/", "must name a registry or repository"),
        ("registry.example.com/ team", "must not contain spaces"),
        ("vllm/vllm-openai:v0.11.0", "without a tag or digest"),
        ("registry.example.com/img@sha256:ab", "without a tag or digest"),
    ],
)
def test_a_prefix_that_cannot_work_is_refused(prefix: str, problem: str) -> None:
    found = prefix_problem(prefix)
    assert found is not None
    assert problem in found


@pytest.mark.parametrize("prefix", ["registry.example.com:5000/team", "docker.io/vllm", "laneway"])
def test_registry_ports_and_plain_names_are_good_prefixes(prefix: str) -> None:
    assert prefix_problem(prefix) is None


def test_the_refusal_names_the_image_and_every_allowed_prefix() -> None:
    message = image_refusal("evil.io/miner:1", ALLOWED)
    assert message is not None
    assert "'evil.io/miner:1'" in message
    assert "registry.example.com/inference, docker.io/vllm" in message
    assert "spec.engine.image" in message
    assert image_refusal("vllm/vllm-openai:v0.11.0", ALLOWED) is None


def pool(engine: dict[str, object], selector: bool = False) -> api.InferencePool:
    spec: dict[str, object] = {"lane": "interactive", "model": "org/model", "engine": engine}
    if selector:
        spec["selector"] = {"matchLabels": {"app": "existing"}}
    return api.parse_pool(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "p", "namespace": "serving"},
            "spec": spec,
        }
    )


def test_the_operators_default_image_for_a_kind_is_checked_too() -> None:
    options = RenderOptions(allowed_image_prefixes=("registry.example.com",))
    refusal = refused_image(pool({"kind": "vllm"}), options)
    assert refusal is not None
    assert DEFAULT_IMAGES[api.EngineKind.VLLM] in refusal
    own = RenderOptions(
        images={**DEFAULT_IMAGES, api.EngineKind.VLLM: "registry.example.com/vllm:1"},
        allowed_image_prefixes=("registry.example.com",),
    )
    assert refused_image(pool({"kind": "vllm"}), own) is None


def test_a_pool_that_adopts_pods_runs_no_image_to_refuse() -> None:
    options = RenderOptions(allowed_image_prefixes=("registry.example.com",))
    assert (
        refused_image(pool({"kind": "vllm", "image": "evil.io/x"}, selector=True), options) is None
    )
