"""The InferencePool CRD in a real API server: structural defaulting and pruning, the OpenAPI
schema and every CEL rule judged by the server itself (on create and on update), the status
and scale subresources, and the printer columns `kubectl get lwpool` shows.

tests/test_crd_cel.py and tests/test_crd_schema.py check the same rules offline (cel-python,
jsonschema); here the cases of their tables go to kube-apiserver, so the offline stand-in
and the real judge must agree."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from support.crd import EXAMPLES, admit, apply_defaults, load_crd, pool_schema, walk
from support.crd_cases import CASES, document
from support.kube.cluster import Cluster

from laneway import api

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module", autouse=True)
def crds(kube: Cluster) -> None:
    kube.install_crds()


def in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"]["namespace"] = namespace
    return out


def cel_messages() -> list[str]:
    return [
        rule["message"]
        for _, node in walk(pool_schema())
        for rule in node.get("x-kubernetes-validations", ())
    ]


def at_path(obj: Any, path: str) -> Any:
    """The value at a simple jsonPath (`.spec.limits.maxContextTokens`), or None."""
    for key in path.lstrip(".").split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def columns(table: str) -> list[dict[str, str]]:
    """kubectl's table as one dict per row, cut where the header's columns start (an empty
    cell leaves no word behind, so splitting on spaces would shift the columns)."""
    header, *rows = table.splitlines()
    names = header.split()
    starts = [header.index(f" {name}") + 1 if i else 0 for i, name in enumerate(names)]
    bounds = [*starts[1:], None]
    return [
        {
            name: row[start:end].strip()
            for name, start, end in zip(names, starts, bounds, strict=True)
        }
        for row in rows
    ]


def test_every_example_pool_is_admitted_defaulted_and_listed(
    kube: Cluster, kube_namespace: str
) -> None:
    for path in EXAMPLES:
        docs = [in_namespace(d, kube_namespace) for d in yaml.safe_load_all(path.read_text()) if d]
        kube.apply(docs)
        for doc in docs:
            stored = kube.get("lwpool", doc["metadata"]["name"], "-n", kube_namespace)
            # The server's structural defaulting is what support.crd predicts offline.
            assert stored["spec"] == apply_defaults(pool_schema(), doc)["spec"], path.name
            api.parse_pool(stored)

    # kubectl shows the CRD's printer columns, each cell the value at its jsonPath: the
    # spec's values as stored, nothing yet where no operator has written a status.
    printer = load_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    table = columns(kube.kubectl("get", "lwpool", "-n", kube_namespace).stdout)
    assert list(table[0]) == ["NAME", *(c["name"].upper() for c in printer)]
    for row in table:
        stored = kube.get("lwpool", row["NAME"], "-n", kube_namespace)
        for column in printer:
            if column["type"] == "date":
                continue  # Age: relative to now
            value = at_path(stored, column["jsonPath"])
            assert row[column["name"].upper()] == ("" if value is None else str(value)), column


@pytest.mark.parametrize(("case", "patch", "rule"), CASES, ids=[c[0] for c in CASES])
def test_the_api_server_judges_each_cel_case_as_the_offline_table_does(
    kube: Cluster, case: str, patch: dict[str, Any], rule: str | None
) -> None:
    doc = in_namespace(document(patch), "default")
    result = kube.kubectl(
        "create", "--dry-run=server", "-f", "-", stdin=json.dumps(doc), check=False
    )
    if rule is None:
        assert result.returncode == 0, (case, result.stderr)
        return
    assert result.returncode != 0, case
    # The server names exactly the rules the offline evaluation fails, with their messages.
    said = [message for message in cel_messages() if message in result.stderr]
    assert sorted(said) == sorted(admit(doc)), (case, result.stderr)


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"lane": "realtime"}, 'spec.lane: Unsupported value: "realtime"'),
        ({"engine": {"kind": "tgi"}}, 'spec.engine.kind: Unsupported value: "tgi"'),
        ({"prefill": {"chunkSize": 8}}, "spec.prefill.chunkSize: Invalid value: 8"),
        ({"replicas": -1}, "spec.replicas: Invalid value: -1"),
        ({"port": 70000}, "spec.port: Invalid value: 70000"),
        ({"prefill": {"tokenBudget": "2048"}}, "spec.prefill.tokenBudget: Invalid value"),
        ({"routing": {"modelz": ["x"]}}, 'unknown field "spec.routing.modelz"'),
    ],
)
def test_the_schema_rejects_bad_fields_with_the_field_named(
    kube: Cluster, patch: dict[str, Any], expected: str
) -> None:
    doc = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"lane": "batch", "model": "m", "engine": {"kind": "simulator"}, **patch},
    }
    result = kube.kubectl(
        "create", "--dry-run=server", "-f", "-", stdin=json.dumps(doc), check=False
    )
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


def test_unknown_fields_are_pruned_when_validation_is_off(
    kube: Cluster, kube_namespace: str
) -> None:
    doc = in_namespace(document({"routing": {"modelz": ["x"]}}), kube_namespace)
    kube.kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(doc))
    stored = kube.get("lwpool", "pool", "-n", kube_namespace)
    assert "modelz" not in stored["spec"].get("routing", {})


def test_cel_rules_hold_on_update_and_leave_the_stored_pool_alone(
    kube: Cluster, kube_namespace: str
) -> None:
    kube.apply([in_namespace(document({}), kube_namespace)])
    before = kube.get("lwpool", "pool", "-n", kube_namespace)
    result = kube.kubectl(
        "patch", "lwpool", "pool", "-n", kube_namespace, "--type=merge",
        "-p", json.dumps({"spec": {"prefill": {"chunkSize": 4096}}}), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert admit(in_namespace(document({"prefill": {"chunkSize": 4096}}), "x"))[0] in result.stderr
    after = kube.get("lwpool", "pool", "-n", kube_namespace)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_status_is_a_subresource_and_spec_changes_raise_the_generation(
    kube: Cluster, kube_namespace: str
) -> None:
    kube.apply([in_namespace(document({}), kube_namespace)])
    ns = ("-n", kube_namespace)
    # Through the main resource, status is ignored.
    kube.kubectl("patch", "lwpool", "pool", *ns, "--type=merge", "-p", '{"status":{"ready":"9/9"}}')
    assert "status" not in kube.get("lwpool", "pool", *ns)
    kube.kubectl(
        "patch", "lwpool", "pool", *ns, "--subresource=status", "--type=merge",
        "-p", '{"status":{"ready":"1/1","replicas":1,"selector":"laneway.io/pool=pool"}}',
    )  # fmt: skip
    stored = kube.get("lwpool", "pool", *ns)
    assert stored["status"]["ready"] == "1/1"
    assert stored["metadata"]["generation"] == 1  # a status write is not a spec change
    kube.kubectl("patch", "lwpool", "pool", *ns, "--type=merge", "-p", '{"spec":{"port":8001}}')
    assert kube.get("lwpool", "pool", *ns)["metadata"]["generation"] == 2


def test_kubectl_scale_goes_through_the_scale_subresource(
    kube: Cluster, kube_namespace: str
) -> None:
    kube.apply([in_namespace(document({"replicas": 1}), kube_namespace)])
    ns = ("-n", kube_namespace)
    kube.kubectl(
        "patch", "lwpool", "pool", *ns, "--subresource=status", "--type=merge",
        "-p", '{"status":{"replicas":1,"selector":"laneway.io/pool=pool"}}',
    )  # fmt: skip
    kube.kubectl("scale", "lwpool", "pool", *ns, "--replicas=3")
    assert kube.get("lwpool", "pool", *ns)["spec"]["replicas"] == 3
    scale = json.loads(
        kube.kubectl(
            "get",
            "--raw",
            f"/apis/laneway.io/v1alpha1/namespaces/{kube_namespace}/inferencepools/pool/scale",
        ).stdout
    )
    assert scale["kind"] == "Scale"
    assert scale["spec"] == {"replicas": 3}
    assert scale["status"] == {"replicas": 1, "selector": "laneway.io/pool=pool"}
