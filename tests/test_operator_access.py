"""What a pool may reach: the Secrets engine env reads only from the operator's allow-list,
and `selector` adoption only of pods that opted in. The reconciler refuses the rest with
Ready=False (a recording FakeCluster stands in for the API server; the real one is in
tests/test_cluster_operator.py), and `laneway render` refuses the same with the same words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fake_cluster import FakeCluster, pool_document

from laneway import api
from laneway.cli import main
from laneway.operator.access import secret_refusal, selector_refusal
from laneway.operator.reconcile import ReconcileOutcome, reconcile
from laneway.operator.render import RenderOptions

NOW = "2026-12-02T06:00:00Z"
SPEC: dict[str, Any] = {
    "lane": "interactive",
    "model": "llama-3.1-8b-instruct",
    "engine": {"kind": "simulator"},
    "limits": {"maxContextTokens": 4096},
}
HF_TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
API_KEYS = {
    "name": "KEYS",
    "valueFrom": {"secretKeyRef": {"name": "laneway-api-key", "key": "tenants.yaml"}},
}


def pool(name: str = "p", **spec: Any) -> api.InferencePool:
    return api.parse_pool(pool_document(name, {**SPEC, **spec}))


def engine_env(*env: dict[str, Any]) -> dict[str, Any]:
    return {"engine": {"kind": "simulator", "env": list(env)}}


SECRETS = [
    # (env, allowed, refused secret or None, why)
    ([HF_TOKEN], ("hf",), None, "an allowed Secret"),
    ([HF_TOKEN], (), "Secret 'hf'", "no Secret is allowed by default"),
    ([HF_TOKEN, API_KEYS], ("hf",), "Secret 'laneway-api-key'", "the second entry is checked too"),
    ([{"name": "A", "value": "b"}], (), None, "a plain value reads nothing"),
    (
        [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        (),
        None,
        "the downward API reads no Secret",
    ),
    (
        [{"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
        (),
        None,
        "a ConfigMap is not a Secret",
    ),
    (
        [{"name": "S", "valueFrom": {"secretKeyRef": {"key": "k"}}}],
        ("hf",),
        "a Secret it does not name",
        "a reference without a name is refused, not guessed",
    ),
    (
        [{"name": "S", "valueFrom": {"secretKeyRef": "laneway-api-key"}}],
        ("hf",),
        "a Secret it does not name",
        "a malformed reference is refused",
    ),
]


@pytest.mark.parametrize(
    ("env", "allowed", "refused"), [c[:3] for c in SECRETS], ids=[c[3] for c in SECRETS]
)
def test_engine_env_reads_only_allowed_secrets(
    env: list[dict[str, Any]], allowed: tuple[str, ...], refused: str | None
) -> None:
    found = secret_refusal(pool(**engine_env(*env)), allowed)
    if refused is None:
        assert found is None
        return
    assert found is not None
    assert found.reason == "SecretNotAllowed"
    assert f"reads {refused}" in found.message
    assert "--allowed-env-secret, the chart's operator.allowedEnvSecrets" in found.message


def test_the_secret_refusal_names_the_entry_and_what_is_allowed() -> None:
    found = secret_refusal(pool(**engine_env(HF_TOKEN, API_KEYS)), ("hf", "other"))
    assert found is not None
    assert found.message.startswith("spec.engine.env[1] (KEYS) reads Secret 'laneway-api-key'")
    assert "the Secrets it allows are hf, other; use one of those" in found.message
    nothing = secret_refusal(pool(**engine_env(HF_TOKEN)), ())
    assert nothing is not None
    assert "it allows none; remove valueFrom.secretKeyRef" in nothing.message


SELECTORS = [
    # (matchLabels, refused, why)
    ({"laneway.io/pool": "p"}, False, "laneway's pool label naming this pool"),
    ({"laneway.io/pool": "p", "app": "engine"}, False, "the pool label among others"),
    ({"laneway.io/adoptable": "true", "app": "engine"}, False, "the opt-in label"),
    ({"app": "redis"}, True, "any pod could carry it"),
    ({"laneway.io/pool": "other"}, True, "another pool's pods"),
    ({"laneway.io/adoptable": "yes"}, True, "the opt-in label says true"),
]


@pytest.mark.parametrize(
    ("labels", "refused"), [c[:2] for c in SELECTORS], ids=[c[2] for c in SELECTORS]
)
def test_a_selector_adopts_only_pods_that_opted_in(labels: dict[str, str], refused: bool) -> None:
    found = selector_refusal(pool(selector={"matchLabels": labels}))
    assert (found is not None) is refused
    if found is not None:
        assert found.reason == "SelectorNotAllowed"
        assert found.withdraw
        assert 'add laneway.io/pool: p (or laneway.io/adoptable: "true")' in found.message


def test_a_pool_without_a_selector_adopts_nothing() -> None:
    assert selector_refusal(pool()) is None


def condition(outcome: ReconcileOutcome, kind: str) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = outcome.status["conditions"]
    return next(c for c in conditions if c["type"] == kind)


async def test_a_pool_reading_a_foreign_secret_is_refused_and_nothing_applied() -> None:
    cluster = FakeCluster()
    allowed = RenderOptions(allowed_env_secrets=("hf",))
    cluster.create(pool_document("p", {**SPEC, **engine_env(HF_TOKEN)}))
    await reconcile(cluster.pool("serving", "p"), cluster, allowed, now=NOW)
    deployment = cluster.objects[("Deployment", "serving", "p")]
    running = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert running == [HF_TOKEN]

    # The gateway's API keys added: refused, and the running Deployment keeps the env it had.
    before = len(cluster.writes())
    cluster.edit(
        api.KIND, "serving", "p", lambda p: p["spec"]["engine"]["env"].append(dict(API_KEYS))
    )
    outcome = await reconcile(cluster.pool("serving", "p"), cluster, allowed, now=NOW)
    assert len(cluster.writes()) == before
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "SecretNotAllowed")
    assert "Secret 'laneway-api-key'" in ready["message"]
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "SecretNotAllowed")]
    deployment = cluster.objects[("Deployment", "serving", "p")]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["env"] == [HF_TOKEN]


async def test_a_selector_that_adopts_foreign_pods_is_refused_and_its_service_withdrawn() -> None:
    # A pool stored before the operator checked selectors: its Service selects the Redis
    # pod, so the gateway would route to it. The pass deletes what reaches those pods.
    cluster = FakeCluster()
    opted_in = {"matchLabels": {"laneway.io/pool": "p", "app": "engine"}}
    cluster.create(pool_document("p", {**SPEC, "selector": opted_in}))
    await reconcile(cluster.pool("serving", "p"), cluster, RenderOptions(), now=NOW)
    service = cluster.objects[("Service", "serving", "p")]
    assert service["spec"]["selector"] == opted_in["matchLabels"]

    cluster.edit(
        api.KIND,
        "serving",
        "p",
        lambda p: p["spec"].update(selector={"matchLabels": {"app": "redis"}}),
    )
    outcome = await reconcile(cluster.pool("serving", "p"), cluster, RenderOptions(), now=NOW)
    assert ("Service", "serving", "p") not in cluster.objects
    assert ("PodDisruptionBudget", "serving", "p") not in cluster.objects
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "SelectorNotAllowed")
    assert "spec.selector (app=redis) could adopt pods that never opted in" in ready["message"]
    reasons = [(e.type, e.reason) for e in outcome.events]
    assert reasons == [
        ("Normal", "Deleted"),
        ("Normal", "Deleted"),
        ("Warning", "SelectorNotAllowed"),
    ]


def write_pools(tmp_path: Path, *pools: dict[str, Any]) -> str:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump_all(pools))
    return str(path)


def test_render_refuses_a_foreign_secret_as_the_operator_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pools(tmp_path, pool_document("p", {**SPEC, **engine_env(API_KEYS)}))
    assert main(["render", path, "--allowed-env-secret", "hf"]) == 2
    error = capsys.readouterr().err
    expected = secret_refusal(pool(**engine_env(API_KEYS)), ("hf",))
    assert expected is not None
    assert error == f"laneway render: error: {path}: InferencePool serving/p: {expected.message}\n"
    assert main(["render", path, "--allowed-env-secret", "laneway-api-key"]) == 0
    assert "secretKeyRef" in capsys.readouterr().out


def test_render_refuses_a_selector_as_the_operator_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    selector = {"matchLabels": {"app": "redis"}}
    path = write_pools(tmp_path, pool_document("p", {**SPEC, "selector": selector}))
    assert main(["render", path]) == 2
    error = capsys.readouterr().err
    assert "InferencePool serving/p: spec.selector (app=redis) could adopt" in error
    assert error.count("\n") == 1


def test_render_refuses_an_image_outside_the_allowed_registries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = {"engine": {"kind": "simulator", "image": "evil.io/miner:1"}}
    path = write_pools(tmp_path, pool_document("p", {**SPEC, **engine}))
    assert main(["render", path, "--allowed-image-prefix", "registry.example.com"]) == 2
    assert "the engine image 'evil.io/miner:1' is not in an allowed registry" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("name", ["Upper", "a b", "trailing-", ""])
def test_a_bad_secret_name_flag_is_refused(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "--allowed-env-secret", name]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"laneway operator: error: --allowed-env-secret {name!r}: must be")
