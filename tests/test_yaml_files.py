"""The YAML files a command reads (the gateway's config, a tenants file, the picker's
objectives) fail the same way, through laneway/yaml_files.py: a file that cannot be read,
one that is not YAML, a value that is no mapping, each one line naming the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from laneway.errors import UsageError
from laneway.gateway.config import load_config
from laneway.gateway.epp.objectives import load_objectives
from laneway.gateway.state.tenants import load_tenants
from laneway.yaml_files import read_yaml_documents

READERS: dict[str, tuple[Callable[[Path], object], str, str]] = {
    # reader, what names the file, a list where the reader wants a mapping
    "config": (load_config, "config", "- [not, a, mapping]\n"),
    "tenants": (load_tenants, "tenants file", "tenants:\n  - [not, a, mapping]\n"),
    "objectives": (load_objectives, "objectives", "- [not, a, mapping]\n"),
}


@pytest.mark.parametrize("reader", READERS)
def test_a_missing_file_is_named(tmp_path: Path, reader: str) -> None:
    load, what, _ = READERS[reader]
    missing = tmp_path / "missing.yaml"
    with pytest.raises(UsageError) as caught:
        load(missing)
    assert str(caught.value).startswith(f"cannot read {what} {missing}: ")


@pytest.mark.parametrize("reader", READERS)
def test_a_file_that_is_not_yaml_is_one_line_naming_it(tmp_path: Path, reader: str) -> None:
    load, _, _ = READERS[reader]
    path = tmp_path / "broken.yaml"
    path.write_text("a: [unclosed\nb: 1\n")
    with pytest.raises(UsageError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert "\n" not in message


@pytest.mark.parametrize("reader", READERS)
def test_a_value_that_is_no_mapping_says_where(tmp_path: Path, reader: str) -> None:
    load, _, text = READERS[reader]
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=r": must be a mapping$") as caught:
        load(path)
    assert str(caught.value).startswith(str(path))


def test_a_file_that_is_not_utf8_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(UsageError, match=f"cannot read objectives {path}: .*utf-8"):
        load_objectives(path)


def test_empty_documents_are_skipped_and_empty_mappings_kept(tmp_path: Path) -> None:
    path = tmp_path / "documents.yaml"
    path.write_text("---\na: 1\n---\n---\n{}\n")
    assert read_yaml_documents(path, "config") == [{"a": 1}, {}]


def test_an_objective_whose_spec_is_no_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
        "metadata: {name: premium}\nspec: []\n"
    )
    with pytest.raises(UsageError, match=r"document 0 \(premium\): spec: must be a mapping"):
        load_objectives(path)
