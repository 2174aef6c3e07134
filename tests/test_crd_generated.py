"""The CRD (both copies) and docs/OPERATOR.md's field table are generated from the models in
laneway/api/: what is committed must be what `python -m laneway.api.crd` writes, so a field
is written in one place and every copy follows it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ConfigDict, Field
from support.crd import load_crd

from laneway import __version__
from laneway.api import crd
from laneway.api.schema import pool_schema, structural
from laneway.api.wire import Wire, rule, rules

ROOT = Path(__file__).resolve().parent.parent
FIX = "run `python -m laneway.api.crd` and commit the result"


@pytest.mark.parametrize("path", [crd.CRD_PATH, crd.CHART_CRD_PATH], ids=str)
def test_each_committed_crd_is_the_generated_one(path: Path) -> None:
    assert (ROOT / path).read_text(encoding="utf-8") == crd.crd_yaml(), f"{path} is stale: {FIX}"


def test_the_operator_docs_table_is_the_generated_one() -> None:
    written = (ROOT / crd.DOC_PATH).read_text(encoding="utf-8")
    assert crd.field_table() in written, f"{crd.DOC_PATH}'s field table is stale: {FIX}"
    assert crd.with_table(written, crd.field_table()) == written


def test_the_crd_carries_the_schema_and_the_release_version() -> None:
    document = yaml.safe_load(crd.crd_yaml())
    (version,) = document["spec"]["versions"]
    assert version["schema"]["openAPIV3Schema"] == pool_schema()
    assert document["metadata"]["labels"]["app.kubernetes.io/version"] == __version__
    # scripts/release.py rewrites the label by this spelling.
    assert f'    app.kubernetes.io/version: "{__version__}"\n' in crd.crd_yaml()
    assert load_crd() == document


def test_every_spec_field_has_a_row_in_the_table() -> None:
    table = crd.field_table()
    spec = pool_schema()["properties"]["spec"]
    for path, _, _ in crd.field_rows(spec, "spec"):
        assert f"| `{path}` |" in table, path
    assert "| `spec.prefill.chunkSize` | integer | 16 to 4194304 | `1024` |" in table
    assert "| `spec.lane` | string | `interactive` \\| `batch` | required |" in table


class _Inner(Wire):
    """A docstring the field's description replaces."""

    size: int = Field(default=16, ge=1, description="How big.")


class _Outer(Wire):
    model_config = ConfigDict(
        json_schema_extra=rules(rule("self.ratio <= 1.0", ".ratio", "at most 1"))
    )

    ratio: float = Field(gt=0, le=2, description="A share.")
    inner: _Inner | None = Field(default=None, description="Optional settings.")
    quantities: dict[str, int | str] = Field(default_factory=dict, description="Amounts.")
    anything: dict[str, Any] = Field(default_factory=dict, description="Passed through.")


def test_the_json_schema_becomes_a_structural_one() -> None:
    assert structural(_Outer) == {
        "type": "object",
        "required": ["ratio"],
        "x-kubernetes-validations": [
            {"rule": "self.ratio <= 1.0", "fieldPath": ".ratio", "message": "at most 1"}
        ],
        "properties": {
            "ratio": {
                "type": "number",
                "exclusiveMinimum": True,
                "minimum": 0,
                "maximum": 2,
                "description": "A share.",
            },
            # inlined, not null-able, described by the field; a default_factory is no default
            "inner": {
                "type": "object",
                "description": "Optional settings.",
                "properties": {
                    "size": {
                        "type": "integer",
                        "minimum": 1,
                        "default": 16,
                        "description": "How big.",
                    }
                },
            },
            "quantities": {
                "type": "object",
                "description": "Amounts.",
                "additionalProperties": {"x-kubernetes-int-or-string": True},
            },
            "anything": {
                "type": "object",
                "description": "Passed through.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }


class _Either(Wire):
    choice: _Inner | _Outer


def test_a_union_kubernetes_cannot_state_is_refused() -> None:
    with pytest.raises(ValueError, match="no structural form"):
        structural(_Either)


def test_a_printer_column_must_name_a_field() -> None:
    with pytest.raises(ValueError, match=r"\.spec\.contextCap names no field"):
        crd.node_at(pool_schema(), ".spec.contextCap")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for path in (crd.CRD_PATH, crd.CHART_CRD_PATH, crd.DOC_PATH):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_check_names_each_stale_file_and_writing_fixes_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert crd.main(["--check", "--root", str(repo)]) == 0
    chart_copy = repo / crd.CHART_CRD_PATH
    chart_copy.write_text(chart_copy.read_text().replace("maximum: 65535", "maximum: 65536"))
    doc = repo / crd.DOC_PATH
    doc.write_text(doc.read_text().replace("Most replicas.", "Most replicas, by hand."))
    assert crd.main(["--check", "--root", str(repo)]) == 1
    said = capsys.readouterr().err
    assert f"{chart_copy} (committed)" in said
    assert "-                  maximum: 65536" in said
    assert f"{doc} (committed)" in said
    assert f"{repo / crd.CRD_PATH} (committed)" not in said
    assert crd.main(["--root", str(repo)]) == 0
    assert crd.main(["--check", "--root", str(repo)]) == 0


def test_a_doc_without_the_markers_is_refused_in_one_line(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = repo / crd.DOC_PATH
    doc.write_text(doc.read_text().replace(crd.TABLE_END, ""))
    assert crd.main(["--root", str(repo)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("laneway.api.crd: ")
    assert "markers" in said
    assert said.count("\n") == 1


def test_the_command_runs_from_the_repository_root() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laneway.api.crd", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
