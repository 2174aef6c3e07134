"""laneway's own processes against the test cluster, as the ServiceAccounts the chart creates:
install a release, get a kubeconfig holding a token the API server issued to the release's
operator or gateway account, and run `laneway operator` / `laneway gateway --kubernetes` with
it, so every call they make passes through that account's RBAC."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from support import ROOT
from support.kube.cluster import Cluster
from support.kube.processes import die_with_parent, eventually

CHART = ROOT / "charts" / "laneway"
LANEWAY = Path(sys.executable).parent / "laneway"


def helm(kube: Cluster, *args: str) -> str:
    binary = shutil.which("helm") or str(ROOT / ".tools" / "bin" / "helm")
    result = subprocess.run(
        [binary, "--kubeconfig", str(kube.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def helm_available() -> bool:
    return shutil.which("helm") is not None or (ROOT / ".tools" / "bin" / "helm").exists()


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    service_accounts: dict[str, str]  # component (operator, gateway) -> ServiceAccount name


def install_release(kube: Cluster, name: str, namespace: str, *flags: str) -> Release:
    """`helm install` the chart (without example pools) and name its ServiceAccounts."""
    helm(
        kube,
        "install",
        name,
        str(CHART),
        "-n",
        namespace,
        "--set",
        "examplePools.enabled=false",
        *flags,
    )
    manifest = [
        d for d in yaml.safe_load_all(helm(kube, "get", "manifest", name, "-n", namespace)) if d
    ]
    accounts = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["metadata"]["name"]
        for d in manifest
        if d["kind"] == "ServiceAccount"
    }
    return Release(name, namespace, accounts)


@contextmanager
def released(kube: Cluster, name: str, namespace: str, *flags: str) -> Iterator[Release]:
    """The chart installed (with helm's `flags`) in a fresh namespace, CRDs first, and
    uninstalled after; the test skips where helm is not installed."""
    if not helm_available():
        pytest.skip("helm is not installed: scripts/install-tools.sh installs it")
    kube.install_crds()
    with kube.namespace(namespace) as created:
        release = install_release(kube, name, created, *flags)
        try:
            yield release
        finally:
            helm(kube, "uninstall", name, "-n", created, "--wait")


@dataclass
class Laneway:
    """One `laneway ...` process with its own kubeconfig; output in a log file."""

    args: list[str]
    kubeconfig: Path
    log: Path
    wrap: Callable[[list[str]], list[str]] = list  # e.g. run inside a network namespace
    popen: subprocess.Popen[bytes] | None = None
    _offset: int = 0  # where the current run's output starts in the log

    def start(self) -> None:
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        # Not in a pod: no in-cluster configuration may be picked up from the environment.
        for variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env.pop(variable, None)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.wrap([str(LANEWAY), *self.args]),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        self.popen = None

    def output(self) -> str:
        """What the latest run wrote."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(self._offset)
            return log.read().decode(errors="replace")


def condition(pool: dict[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type `kind`, or {} when there is none yet."""
    for c in pool.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            found: dict[str, Any] = c
            return found
    return {}


def answers(url: str) -> bool:
    """`url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_listening(kube: Cluster, namespace: str, name: str, timeout_s: float) -> None:
    """Until the engine started for pool `name` answers on the pods' address: KWOK makes a
    pod Ready at once, while a real engine process takes seconds to listen."""
    network = kube.pod_network
    assert network is not None
    port = kube.get("lwpool", name, "-n", namespace)["spec"]["port"]
    health = f"http://{network.pod_ip}:{port}/health"
    eventually(f"the engine of pool {name} listens", lambda: answers(health), timeout_s)


def engine_for_pool(kube: Cluster, namespace: str, name: str, timeout_s: float) -> Laneway:
    """The engine the operator rendered for pool `name` (`status.engineArgs`), to run on the
    address KWOK gives the pods on kwok-host, inside the run's pod network namespace: the
    process that answers for the pool's pods there. Not started."""
    network = kube.pod_network
    assert network is not None

    def rendered() -> bool:
        pool = kube.get("lwpool", name, "-n", namespace)
        return bool(pool.get("status", {}).get("engineArgs"))

    eventually(f"the operator renders pool {name}", rendered, timeout_s)
    argv = kube.get("lwpool", name, "-n", namespace)["status"]["engineArgs"]
    assert argv[:2] == ["laneway", "sim"], argv
    args = list(argv[1:])
    args[args.index("--host") + 1] = network.pod_ip
    return Laneway(args, kube.kubeconfig, kube.log_path(f"engine-{name}"), network.inside)


def lane_pool(pools: Sequence[dict[str, Any]], lane: str) -> dict[str, Any]:
    """The pool of `lane` among `pools`."""
    return next(p for p in pools if p["spec"]["lane"] == lane)


def public_model(pool: dict[str, Any]) -> str:
    """A model name a client may ask the gateway for to reach `pool`."""
    spec = pool["spec"]
    models: list[str] = spec.get("routing", {}).get("models") or [
        spec.get("servedModelName", spec["model"])
    ]
    return models[0]


def check_long_request_streams_to_batch(
    api: openai.OpenAI, pools: Sequence[dict[str, Any]]
) -> None:
    """A document longer than the interactive pool's prompt cap, streamed through the gateway
    with the official client: it takes the batch lane, says so in its headers with a prompt
    count above the cap, and streams content back."""
    batch = lane_pool(pools, "batch")
    cap = lane_pool(pools, "interactive")["spec"]["routing"]["maxPromptTokens"]
    document = "The contract clause reads as follows. " * (cap // 4)
    with api.chat.completions.with_streaming_response.create(
        model=public_model(batch),
        messages=[{"role": "user", "content": f"Summarize:\n{document}"}],
        max_tokens=16,
        stream=True,
    ) as response:
        assert response.headers["x-laneway-lane"] == "batch"
        assert response.headers["x-laneway-pool"] == batch["metadata"]["name"]
        assert int(response.headers["x-laneway-prompt-tokens"]) > cap
        chunks = list(response.parse())
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
