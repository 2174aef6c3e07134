"""A real Kubernetes control plane for the cluster tests, as local processes on loopback.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from the Go modules
pinned in e2e/controlplane/ by scripts/controlplane.sh, plus KWOK playing two nodes and their
pods: the API server enforces what a production one does (structural schemas, CEL, RBAC,
admission, server-side apply, watch semantics), the controllers run Deployments, EndpointSlices
and garbage collection, and KWOK makes pods Ready. Pods on `kwok-node` get addresses from a
made-up range; pods on `kwok-host` (tainted: only pods that tolerate it) get the address of a
network namespace this run makes (`PodNetwork`), where a test starts the process that answers
for the pod. The API server refuses loopback addresses in EndpointSlices, and test traffic
goes nowhere but loopback and the run's own namespace.

`$LANEWAY_TEST_KUBECONFIG` points the same tests at any other cluster (kind, a real one):
then nothing is started here, and the tests that need to restart the API server or to play
pods on this machine are skipped.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support import ROOT
from support.kube.network import PodNetwork, make_pod_network, remove_pod_network
from support.kube.pki import make_pki, write_kubeconfig
from support.kube.processes import Process, eventually, free_port

BUILD_SCRIPT = ROOT / "scripts" / "controlplane.sh"
KWOK_STAGES = ROOT / "e2e" / "controlplane" / "kwok-stages.yaml"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
EXTERNAL_KUBECONFIG = "LANEWAY_TEST_KUBECONFIG"
SERVICE_CIDR = "10.96.0.0/24"
NODE_NAME = "kwok-node"
HOST_NODE_NAME = "kwok-host"
HOST_NODE_TAINT = {"key": "laneway.io/test-host", "value": "true", "effect": "NoSchedule"}
POD_CIDR = "192.0.2.0/25"  # without a pod network: a documentation range
# Generous: on a loaded 2-core machine the API server takes tens of seconds to be ready.
START_TIMEOUT_S = 240.0

Manifest = dict[str, Any]


def binaries_folder() -> Path:
    """Where scripts/controlplane.sh keeps (or would keep) the binaries of the pinned versions."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def missing_binaries(folder: Path) -> list[str]:
    return [b for b in BINARIES if not (folder / b).is_file()]


@dataclass
class Cluster:
    """A cluster the tests talk to: its admin kubeconfig, and what it can do here."""

    kubeconfig: Path
    local: bool  # started here: its API server can be restarted, its pods played by KWOK
    workdir: Path
    pod_network: PodNetwork | None = None  # where pods on kwok-host live, when it exists
    apiserver_restarts: int = 0
    _processes: dict[str, Process] = field(default_factory=dict)

    # --- kubectl ------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def get(self, *args: str, kubeconfig: Path | None = None) -> Manifest:
        out = self.kubectl("get", *args, "-o", "json", kubeconfig=kubeconfig).stdout
        decoded: Manifest = json.loads(out)
        return decoded

    def exists(self, *args: str) -> bool:
        result = self.kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False)
        return result.returncode == 0 and bool(result.stdout.strip())

    def apply(self, documents: list[Manifest], *extra: str) -> None:
        self.kubectl("apply", "-f", "-", *extra, stdin=yaml.safe_dump_all(documents))

    def install_crds(self) -> None:
        """`kubectl apply -f crds/`, then wait until the API server serves the kinds."""
        self.kubectl("apply", "-f", str(ROOT / "crds"))
        self.wait_established("inferencepools.laneway.io")

    def wait_established(self, crd: str) -> None:
        """Until the API server serves the CRD's kind. Polled, not `kubectl wait
        --for=condition=Established`: that fails at once with ".status.conditions accessor
        error" when it reads the CRD before the API server has written any condition."""
        eventually(
            f"crd/{crd} is Established",
            lambda: self.kubectl(
                "get", f"crd/{crd}", "-o",
                "jsonpath={.status.conditions[?(@.type=='Established')].status}",
            ).stdout.strip() == "True",
            timeout_s=150,
        )  # fmt: skip

    @contextlib.contextmanager
    def namespace(self, name: str) -> Iterator[str]:
        """A fresh namespace, deleted (without waiting) afterwards."""
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount with a token the API server
        issues for it (TokenRequest), as a pod's projected token would."""
        token = self.kubectl(
            "create", "token", name, "--namespace", namespace, "--duration", "2h"
        ).stdout.strip()
        config = yaml.safe_load(self.kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        ca_path = self.workdir / "sa-ca.crt"
        if "certificate-authority-data" in cluster:
            ca_path.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            ca_path = Path(cluster["certificate-authority"])
        return write_kubeconfig(path, cluster["server"], ca_path, {"token": token})

    # --- the local control plane --------------------------------------------------------

    def log_path(self, name: str) -> Path:
        """Where a test's own process logs, beside the control plane's logs (kept with them
        under $LANEWAY_TEST_CLUSTER_LOGS)."""
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        return logs / f"{name}.log"

    def process(self, name: str) -> Process:
        return self._processes[name]

    def restart_apiserver(self, while_down: Callable[[], None] = lambda: None) -> None:
        """Stop the API server, call `while_down`, start it again and wait until ready."""
        apiserver = self._processes["kube-apiserver"]
        apiserver.stop()
        while_down()
        apiserver.start()
        self.apiserver_restarts += 1
        self._wait_ready()

    def start(self, folder: Path) -> None:
        pki = self.workdir / "pki"
        make_pki(pki)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        write_kubeconfig(
            self.kubeconfig,
            server,
            pki / "ca.crt",
            {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
        )
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)

        def add(name: str, *args: str) -> None:
            self._processes[name] = Process(name, [str(folder / name), *args], logs / f"{name}.log")

        add(
            "etcd",
            "--name=test",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=test=http://127.0.0.1:{peer_port}",
            "--listen-metrics-urls=",
            # A test cluster's data is thrown away: no fsync keeps a loaded disk out of it.
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        add(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        )
        add(
            "kube-controller-manager",
            f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--profiling=false",
            "--v=1",
        )
        add(
            "kube-scheduler",
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        )
        self.pod_network = make_pod_network()
        # Without the namespace (not root), pods get addresses nothing here answers on, and
        # the tests that send traffic to pods skip.
        network = self.pod_network
        addresses = {
            "HOST_IP": network.pod_ip if network else "192.0.2.250",
            "NODE_IP": network.node_ip if network else "192.0.2.254",
        }
        stages = self.workdir / "kwok-stages.yaml"
        text = KWOK_STAGES.read_text()
        for placeholder, address in addresses.items():
            text = text.replace(placeholder, address)
        stages.write_text(text)
        add(
            "kwok",
            f"--kubeconfig={self.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=true",
            f"--cidr={network.pod_cidr if network else POD_CIDR}",
            f"--server-address=127.0.0.1:{free_port()}",
            "--node-lease-duration-seconds=40",
        )
        self._processes["etcd"].start()
        self._processes["kube-apiserver"].start()
        self._wait_ready()
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._processes[name].start()
        self._add_nodes()

    def _add_nodes(self) -> None:
        def node(name: str, taints: list[dict[str, str]]) -> Manifest:
            return {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {"taints": taints},
            }

        self.apply([node(NODE_NAME, []), node(HOST_NODE_NAME, [HOST_NODE_TAINT])])
        for name in (NODE_NAME, HOST_NODE_NAME):
            eventually(
                f"KWOK reports node {name} Ready",
                functools.partial(self.node_ready, name),
                START_TIMEOUT_S,
            )

    def node_ready(self, name: str) -> bool:
        conditions = self.get("node", name).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _wait_ready(self) -> None:
        config = yaml.safe_load(self.kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
        user = config["users"][0]["user"]
        context = ssl.create_default_context(
            cafile=config["clusters"][0]["cluster"]["certificate-authority"]
        )
        context.load_cert_chain(user["client-certificate"], user["client-key"])

        def ready() -> bool:
            for process in self._processes.values():
                if process.popen is not None and not process.running():
                    raise AssertionError(
                        f"{process.name} exited {process.popen.returncode}:\n{process.tail()}"
                    )
            try:
                with urllib.request.urlopen(f"{server}/readyz", context=context, timeout=5) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        eventually("the API server is ready (/readyz)", ready, START_TIMEOUT_S)

    def stop(self) -> None:
        for name in reversed(list(self._processes)):
            self._processes[name].stop()
        if self.pod_network is not None:
            remove_pod_network(self.pod_network)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in self._processes.values())


@contextlib.contextmanager
def cluster_for_tests(keep_logs_in: Path | None = None) -> Iterator[Cluster | str]:
    """The cluster the tests run against, or why there is none."""
    external = os.environ.get(EXTERNAL_KUBECONFIG)
    workdir = Path(tempfile.mkdtemp(prefix="laneway-cluster-"))
    try:
        if external:
            yield Cluster(Path(external), local=False, workdir=workdir)
            return
        if shutil.which("kubectl") is None or shutil.which("openssl") is None:
            yield "the cluster tests need kubectl and openssl on PATH"
            return
        folder = binaries_folder()
        missing = missing_binaries(folder)
        if missing:
            yield (
                f"no control-plane binaries in {folder} (missing {', '.join(missing)}): "
                "scripts/controlplane.sh build makes them (scripts/test.sh runs it)"
            )
            return
        cluster = Cluster(workdir / "admin.kubeconfig", local=True, workdir=workdir)
        try:
            cluster.start(folder)
            yield cluster
        finally:
            cluster.stop()
            if keep_logs_in is not None and (workdir / "logs").exists():
                shutil.copytree(workdir / "logs", keep_logs_in, dirs_exist_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
