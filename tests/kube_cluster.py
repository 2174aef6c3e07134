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
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
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


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent() -> None:
    """For Popen's preexec_fn: the child is killed when the test run that started it dies,
    however it dies, so no control plane outlives a killed pytest on a shared machine."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def eventually(what: str, check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Poll `check` until it holds; fail with `what` after `timeout_s` (a generous bound
    for a loaded machine, not a budget the behaviour is judged by)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting until {what}")
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


@dataclass(frozen=True)
class PodNetwork:
    """A network namespace of this run that owns every pod address of the cluster.

    A veth pair joins it to this machine, and the pod range is routed into it, where a local
    route makes each of its addresses answer: an engine for a pod on `kwok-host` listens there
    on the pod's address, and anything sent to another pod is refused at once. Test traffic
    thus goes nowhere but loopback and this run's own namespace.
    """

    namespace: str
    host_link: str
    pod_cidr: str  # what KWOK gives pods on ordinary nodes
    pod_ip: str  # the address of every pod on kwok-host
    node_ip: str

    def inside(self, argv: list[str]) -> list[str]:
        """`argv`, run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def make_pod_network() -> PodNetwork | None:
    """A fresh namespace, veth pair and routes (root only); None where they cannot be made."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None
    pid = os.getpid()
    # 198.18.0.0/15 is reserved for network tests (RFC 2544): per run, by process id, a /24
    # of pod addresses and a /30 for the link.
    third, block = pid % 256, (pid // 256) % 64 * 4
    pods = f"198.18.{third}"
    host_end, namespace_end = f"198.19.{third}.{block + 1}", f"198.19.{third}.{block + 2}"
    network = PodNetwork(
        namespace=f"laneway-pods-{pid}",
        host_link=f"lwh{pid}",
        pod_cidr=f"{pods}.0/25",
        pod_ip=f"{pods}.250",
        node_ip=f"{pods}.254",
    )
    peer = f"lwp{pid}"
    steps = [
        ["ip", "netns", "add", network.namespace],
        ["ip", "link", "add", network.host_link, "type", "veth", "peer", "name", peer],
        ["ip", "link", "set", peer, "netns", network.namespace],
        ["ip", "addr", "add", f"{host_end}/30", "dev", network.host_link],
        ["ip", "link", "set", network.host_link, "up"],
        ["ip", "route", "add", f"{pods}.0/24", "via", namespace_end],
        network.inside(["ip", "addr", "add", f"{namespace_end}/30", "dev", peer]),
        network.inside(["ip", "link", "set", peer, "up"]),
        network.inside(["ip", "link", "set", "lo", "up"]),
        network.inside(["ip", "route", "add", "local", f"{pods}.0/24", "dev", "lo"]),
    ]
    for step in steps:
        if subprocess.run(step, capture_output=True, check=False).returncode != 0:
            remove_pod_network(network)
            return None
    return network


def remove_pod_network(network: PodNetwork) -> None:
    subprocess.run(["ip", "link", "delete", network.host_link], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "delete", network.namespace], capture_output=True, check=False)


def binaries_folder() -> Path:
    """Where scripts/controlplane.sh keeps (or would keep) the binaries of the pinned versions."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def missing_binaries(folder: Path) -> list[str]:
    return [b for b in BINARIES if not (folder / b).is_file()]


# --- certificates -------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _sign(pki: Path, name: str, subject: str, extensions: str) -> None:
    """A P-256 key and a certificate for it signed by the test CA."""
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=pki,
    )  # fmt: skip
    (pki / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=pki,
    )  # fmt: skip


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate, an admin client certificate (group
    system:masters) and the key pair that signs service-account tokens."""
    pki.mkdir(parents=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=laneway-test-ca",
        cwd=pki,
    )  # fmt: skip
    service_ip = "10.96.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
    _sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "subjectAltName=IP:127.0.0.1,IP:" + service_ip + ",DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
    )
    _sign(
        pki,
        "admin",
        "/O=system:masters/CN=laneway-test-admin",
        "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
    )
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "sa.key", cwd=pki)  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, str]) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# --- processes ----------------------------------------------------------------------------


@dataclass
class Process:
    """One control-plane process, its output in a log file."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        self.popen = None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


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
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=120s",
            "crd/inferencepools.laneway.io", timeout=150,
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
