"""The upstream InferencePools (inference.networking.k8s.io/v1) the operator renders for
laneway's endpoint picker: one per model, selecting every engine pod of that model across
laneway's pools, naming the picker Service, owned by those pools; checked against the
upstream CRD written from its v1 API (tests/support/gateway_api/), and kept in line by the
reconciler against a recording FakeCluster. tests/test_cluster_upstream.py runs the same on
a real API server with both CRDs installed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.crd import admit, upstream_schema
from support.fake_cluster import FakeCluster, pool_document

from laneway import api
from laneway.kube.client import UPSTREAM_POOL, KubeError
from laneway.operator.reconcile import reconcile, reconcile_upstream
from laneway.operator.render import RenderOptions, render_pool
from laneway.operator.upstream import (
    FailureMode,
    PickerRef,
    model_label,
    model_slug,
    upstream_pools,
)

NOW = "2026-12-02T06:00:00Z"
PICKER = PickerRef(service="lw-laneway-picker")
CHAT: dict[str, Any] = {
    "lane": "interactive",
    "model": "llama-3-8b",
    "servedModelName": "llama-3-8b-chat",
    "engine": {"kind": "simulator"},
    "routing": {"models": ["laneway-demo", "meta-llama/Llama-3.1-8B-Instruct"]},
    "limits": {"maxContextTokens": 4096},
}
DOCUMENTS: dict[str, Any] = {
    "lane": "batch",
    "model": "llama-3-8b",
    "servedModelName": "llama-3-8b-docs",
    "engine": {"kind": "simulator"},
    "port": 8001,
    "routing": {"models": ["laneway-demo"], "minPromptTokens": 4097},
    "limits": {"maxContextTokens": 131072},
}
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")

SLUGS = [
    # (model, slug or None for "hashed", why)
    ("laneway-demo", "laneway-demo", "a DNS name is kept"),
    ("llama-3.1-8b-instruct", "llama-3.1-8b-instruct", "dots are kept"),
    ("meta-llama/Llama-3.1-8B-Instruct", None, "a slash and capitals are spelled out"),
    ("Llama", None, "capitals alone make another model than llama"),
    ("x" * 64, None, "too long for a label"),
    ("///", None, "nothing left to spell"),
]


@pytest.mark.parametrize(("model", "slug"), [c[:2] for c in SLUGS], ids=[c[2] for c in SLUGS])
def test_a_model_names_its_upstream_pool_and_label(model: str, slug: str | None) -> None:
    found = model_slug(model)
    if slug is not None:
        assert found == slug
    else:
        assert re.fullmatch(r".*-[0-9a-f]{8}", found)
    assert len(found) <= 63
    assert _LABEL_NAME.fullmatch(found)
    assert model_label(model) == f"models.laneway.io/{found}"


def test_models_that_spell_alike_get_different_names() -> None:
    assert model_slug("Llama") != model_slug("llama")
    assert model_slug("a/b") != model_slug("a-b")


def pools(*specs: tuple[str, dict[str, Any]]) -> list[api.InferencePool]:
    return [api.parse_pool(pool_document(name, spec)) for name, spec in specs]


def test_one_upstream_pool_per_model_selects_every_lanes_pods() -> None:
    rendered = upstream_pools(pools(("chat", CHAT), ("documents", DOCUMENTS)), PICKER)
    by_name = {u["metadata"]["name"]: u for u in rendered}
    demo = by_name["laneway-demo"]
    assert demo["apiVersion"] == "inference.networking.k8s.io/v1"
    assert demo["kind"] == "InferencePool"
    assert demo["metadata"]["namespace"] == "serving"
    assert demo["metadata"]["annotations"] == {"laneway.io/model": "laneway-demo"}
    assert demo["spec"]["selector"] == {"matchLabels": {"models.laneway.io/laneway-demo": "true"}}
    assert demo["spec"]["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert demo["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "lw-laneway-picker",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    llama = by_name[model_slug("meta-llama/Llama-3.1-8B-Instruct")]
    assert llama["spec"]["targetPorts"] == [{"number": 8000}], "only the chat pool serves it"
    for upstream in rendered:
        assert admit(upstream, upstream_schema()) == [], upstream["metadata"]["name"]


def test_the_failure_mode_is_the_operators() -> None:
    open_picker = PickerRef(service="p", failure_mode=FailureMode.FAIL_OPEN)
    [upstream] = upstream_pools(pools(("documents", DOCUMENTS)), open_picker)
    assert upstream["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


def test_the_upstream_schema_refuses_what_the_v1_api_refuses() -> None:
    [upstream] = upstream_pools(pools(("documents", DOCUMENTS)), PICKER)
    no_port = {**upstream, "spec": {**upstream["spec"]}}
    no_port["spec"]["endpointPickerRef"] = {"name": "p"}
    assert admit(no_port, upstream_schema()) == [
        "port is required when kind is 'Service' or unspecified (defaults to 'Service')"
    ]
    twice = {**upstream, "spec": {**upstream["spec"], "targetPorts": [{"number": 1}] * 2}}
    assert admit(twice, upstream_schema()) == ["port number must be unique"]
    bad_mode = {**upstream, "spec": {**upstream["spec"]}}
    bad_mode["spec"]["endpointPickerRef"] = {"name": "p", "port": {"number": 9002},
                                             "failureMode": "Maybe"}  # fmt: skip
    assert any("failureMode" in e for e in admit(bad_mode, upstream_schema()))


def test_engine_pods_carry_their_models_labels_and_the_selector_stays() -> None:
    [chat] = pools(("chat", CHAT))
    plain = render_pool(chat, RenderOptions()).child("Deployment")
    picked = render_pool(chat, RenderOptions(picker=PICKER)).child("Deployment")
    assert plain is not None
    assert picked is not None
    labels = picked["spec"]["template"]["metadata"]["labels"]
    assert labels["models.laneway.io/laneway-demo"] == "true"
    assert labels[model_label("meta-llama/Llama-3.1-8B-Instruct")] == "true"
    assert not any(k.startswith("models.") for k in plain["spec"]["template"]["metadata"]["labels"])
    # A Deployment's selector cannot change: turning the picker on only relabels the pods.
    assert picked["spec"]["selector"] == plain["spec"]["selector"]


async def sync(cluster: FakeCluster) -> list[str]:
    return await reconcile_upstream("serving", cluster, PICKER)


async def test_the_reconciler_applies_owns_and_prunes_the_upstream_pools() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("chat", CHAT))
    cluster.create(pool_document("documents", DOCUMENTS))
    options = RenderOptions(picker=PICKER)
    for name in ("chat", "documents"):
        await reconcile(cluster.pool("serving", name), cluster, options, now=NOW)
    changes = await sync(cluster)
    llama = model_slug("meta-llama/Llama-3.1-8B-Instruct")
    assert changes == [
        f"applied {UPSTREAM_POOL} serving/laneway-demo",
        f"applied {UPSTREAM_POOL} serving/{llama}",
    ]
    demo = cluster.objects[(UPSTREAM_POOL, "serving", "laneway-demo")]
    owners = [(o["name"], o["controller"]) for o in demo["metadata"]["ownerReferences"]]
    assert owners == [("chat", False), ("documents", False)]
    before = len(cluster.writes())
    assert await sync(cluster) == []  # nothing differs: nothing written
    assert len(cluster.writes()) == before

    # The chat pool stops answering the Llama name: its upstream pool goes.
    cluster.edit(api.KIND, "serving", "chat", lambda p: p["spec"]["routing"].update(
        models=["laneway-demo"]))  # fmt: skip
    assert await sync(cluster) == [
        f"deleted {UPSTREAM_POOL} serving/{llama}: no pool serves its model"
    ]

    # Deleting one pool keeps the model's upstream pool (another owner serves it); deleting
    # the last lets the garbage collector take it.
    cluster.remove(api.KIND, "serving", "chat")
    assert (UPSTREAM_POOL, "serving", "laneway-demo") in cluster.objects
    cluster.remove(api.KIND, "serving", "documents")
    assert (UPSTREAM_POOL, "serving", "laneway-demo") not in cluster.objects


async def test_an_upstream_pool_laneway_did_not_make_is_left_alone() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("documents", DOCUMENTS))
    theirs = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "laneway-demo", "namespace": "serving"},
        "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "targetPorts": [{"number": 1}]},
    }
    cluster.create(theirs)
    changes = await sync(cluster)
    assert changes == [f"left {UPSTREAM_POOL} serving/laneway-demo alone: laneway did not make it"]
    kept = cluster.objects[(UPSTREAM_POOL, "serving", "laneway-demo")]
    assert kept["spec"]["selector"] == {"matchLabels": {"app": "theirs"}}


async def test_without_the_upstream_crd_nothing_is_rendered() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("documents", DOCUMENTS))
    cluster.failures.append(KubeError(404, "the server could not find the requested resource"))
    assert await sync(cluster) == []
    assert cluster.writes() == []
