"""`laneway epp`'s pool flags, the ones `laneway gateway` takes (gateway/cli.py's
add_pool_flags and pool_source): bad combinations are usage errors naming the command."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.pools import gateway_doc

from laneway.cli import main


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip()


def test_without_config_or_kubernetes_it_says_which_to_give(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert refusal(capsys, ["epp"]) == (
        "laneway epp: error: give --config FILE with the pools, or --kubernetes to watch them"
    )


@pytest.mark.parametrize("flags", [["--namespace", "a"], ["--all-namespaces"]])
def test_namespace_flags_need_kubernetes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    error = refusal(capsys, ["epp", "--config", str(tmp_path / "unused.yaml"), *flags])
    assert error == f"laneway epp: error: {flags[0]} needs --kubernetes"


def test_a_config_without_pools_is_refused_unless_the_cluster_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(gateway_doc()))
    error = refusal(capsys, ["epp", "--config", str(config)])
    assert error == (
        f"laneway epp: error: {config}: holds no InferencePool document to pick endpoints in"
    )


def test_help_names_the_kubernetes_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["epp", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--kubernetes watch InferencePools and their endpoints in the cluster" in text
    assert "--all-namespaces with --kubernetes: watch every namespace" in text


def test_a_trusted_fairness_id_needs_the_tenants_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = refusal(
        capsys, ["epp", "--config", str(tmp_path / "unused.yaml"), "--trust-fairness-id"]
    )
    assert error == (
        "laneway epp: error: --trust-fairness-id needs --tenants: the tenants the fairness id names"
    )


def test_help_names_the_tenant_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["epp", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--redis-url", "--tenants PATH", "--trust-fairness-id", "--tenant-max-concurrent"):
        assert flag in text


@pytest.mark.parametrize("command", ["epp", "gateway"])
@pytest.mark.parametrize(
    "flag",
    ["--tenant-max-concurrent", "--tenant-max-queued", "--tenant-max-concurrent-prompt-tokens"],
)
def test_a_tenant_cap_needs_the_tenants_it_caps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, flag: str
) -> None:
    error = refusal(capsys, [command, "--config", str(tmp_path / "unused.yaml"), flag, "4"])
    assert error == (
        f"laneway {command}: error: {flag} needs --tenants: its cap is per tenant, and "
        "without --tenants every request is anonymous"
    )
