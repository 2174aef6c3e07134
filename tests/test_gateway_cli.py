"""`laneway gateway --kubernetes`: which namespace it watches, as its --help says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from laneway.cli import build_parser, main
from laneway.errors import UsageError
from laneway.gateway.cli import POD_NAMESPACE_FILE, watched_namespace

MISSING = None  # the pod namespace file does not exist (not in a pod)

NAMESPACES = [
    # (case, flags, content of the pod's namespace file, namespace watched; None is every one)
    ("in a pod: the pod's own namespace", [], "serving\n", "serving"),
    ("outside a pod: every namespace", [], MISSING, None),
    ("--namespace wins over the pod's", ["--namespace", "other"], "serving", "other"),
    ("--namespace outside a pod", ["--namespace", "other"], MISSING, "other"),
    ("--all-namespaces even in a pod", ["--all-namespaces"], "serving", None),
]


@pytest.mark.parametrize(
    ("flags", "pod_file_text", "expected"),
    [c[1:] for c in NAMESPACES],
    ids=[c[0] for c in NAMESPACES],
)
def test_the_watched_namespace(
    tmp_path: Path, flags: list[str], pod_file_text: str | None, expected: str | None
) -> None:
    pod_file = tmp_path / "namespace"
    if pod_file_text is not None:
        pod_file.write_text(pod_file_text)
    args = build_parser().parse_args(["gateway", "--kubernetes", *flags])
    assert watched_namespace(args, pod_file) == expected


BAD = [
    # (case, flags, content of the pod's namespace file, what the error says)
    ("both flags", ["--namespace", "a", "--all-namespaces"], "serving", "not both"),
    ("an empty --namespace", ["--namespace", ""], "serving", "must not be empty"),
    ("an empty pod file", [], "  \n", "is empty; give --namespace NS or --all-namespaces"),
]


@pytest.mark.parametrize(
    ("flags", "pod_file_text", "complaint"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_bad_namespace_choices_are_usage_errors(
    tmp_path: Path, flags: list[str], pod_file_text: str, complaint: str
) -> None:
    pod_file = tmp_path / "namespace"
    pod_file.write_text(pod_file_text)
    args = build_parser().parse_args(["gateway", "--kubernetes", *flags])
    with pytest.raises(UsageError, match=complaint):
        watched_namespace(args, pod_file)


def test_an_unreadable_pod_file_is_a_usage_error(tmp_path: Path) -> None:
    args = build_parser().parse_args(["gateway", "--kubernetes"])
    # A directory where the file should be: it exists but cannot be read as one.
    with pytest.raises(UsageError, match="cannot read the pod's namespace from"):
        watched_namespace(args, tmp_path)


@pytest.mark.parametrize("flags", [["--namespace", "a"], ["--all-namespaces"]])
def test_namespace_flags_need_kubernetes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    assert main(["gateway", "--config", str(tmp_path / "unused.yaml"), *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"laneway gateway: error: {flags[0]} needs --kubernetes"


def test_help_states_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    # argparse wraps long words; compare without the line breaks.
    assert "the pod's own, read from" in text
    assert str(POD_NAMESPACE_FILE) in text.replace(" ", "")
    assert "every namespace when that file does not exist" in text
    assert "--all-namespaces with --kubernetes: watch every namespace, even in a pod" in text


SETTLED_COLLECTIONS = """
import gc
from laneway.gateway.cli import YOUNG_COLLECTION_THRESHOLD, settle_heap

settle_heap()
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info))
in_flight = [{} for _ in range(4000)]  # 64 requests in flight, their objects alive
held = len(collections)
in_flight += [{} for _ in range(YOUNG_COLLECTION_THRESHOLD)]
print(gc.get_freeze_count() > 0, held, len(collections) > 0)
"""


def test_the_settled_heap_is_frozen_and_live_requests_start_no_collection() -> None:
    # In a process of its own: freezing and thresholds are the whole interpreter's.
    done = subprocess.run(
        [sys.executable, "-P", "-c", SETTLED_COLLECTIONS],
        capture_output=True,
        text=True,
        check=True,
    )
    # Frozen; the objects of the requests in flight started no collection; past it, one ran.
    assert done.stdout.split() == ["True", "0", "True"]
