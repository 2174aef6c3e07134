"""`laneway render FILE` and `laneway operator` from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from support.crd import EXAMPLES

from laneway.cli import main

LANEWAY = [sys.executable, "-m", "laneway.cli"]


def test_render_prints_valid_manifests() -> None:
    realtime = next(p for p in EXAMPLES if "realtime" in p.name)
    result = subprocess.run(
        # The example's engine reads its Hugging Face token from the Secret `huggingface`.
        [*LANEWAY, "render", str(realtime), "--allowed-env-secret", "huggingface"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in documents] == ["Service", "Deployment", "PodDisruptionBudget"]
    for document in documents:
        kubernetes_validate.validate(document, "1.37", strict=True)
    assert result.stdout.startswith("# InferencePool default/realtime: vllm serve ")


def test_render_reads_stdin_and_sets_images(capsys: pytest.CaptureFixture[str]) -> None:
    simulators = next(p for p in EXAMPLES if "simulator" in p.name)
    sys.stdin = open(simulators)  # noqa: SIM115 - closed below; main() reads sys.stdin
    try:
        assert main(["render", "-", "--image", "simulator=laneway:dev"]) == 0
    finally:
        sys.stdin.close()
        sys.stdin = sys.__stdin__
    documents = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert len(deployments) == 2
    for deployment in deployments:
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "laneway:dev"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("a: [unclosed", "not valid YAML"),
        ("kind: GatewayConfig\n", "no InferencePool documents"),
        (
            "apiVersion: laneway.io/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
            "spec: {lane: batch, model: m, engine: {kind: vllm},\n"
            "       prefill: {chunkSize: 4096, tokenBudget: 2048}}\n",
            "InferencePool p: spec.prefill.chunkSize: chunkSize (4096) must not exceed "
            "tokenBudget (2048): lower chunkSize or raise tokenBudget",
        ),
    ],
    ids=["missing", "bad-yaml", "no-pools", "invalid-pool"],
)
def test_render_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "pools.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["render", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("laneway render: error: ")
    assert message in error
    assert error.count("\n") == 1


def test_render_rejects_a_bad_image_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLES[0]), "--image", "tgi=x"]) == 2
    assert "expected KIND=IMAGE" in capsys.readouterr().err


def test_operator_without_a_cluster_says_so(tmp_path: Path) -> None:
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")
    }
    environment.update(KUBECONFIG=str(tmp_path / "missing"), HOME=str(tmp_path))
    result = subprocess.run(
        [*LANEWAY, "operator"], capture_output=True, text=True, env=environment, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.startswith("laneway operator: error: no Kubernetes configuration")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gateway-url", "laneway-gateway:8080"], "must start with http:// or https://"),
        (["--demand-interval", "0.1"], "--demand-interval 0.1: must be 1-3600 seconds"),
        (
            ["--allowed-image-prefix", "vllm/vllm-openai:v0.11.0"],
            "--allowed-image-prefix 'vllm/vllm-openai:v0.11.0': must be a registry or "
            "repository prefix without a tag or digest",
        ),
    ],
)
def test_operator_rejects_bad_demand_loop_flags(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["operator", *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith("laneway operator: error: ")
    assert message in error
