"""The network namespace that owns the test cluster's pod addresses (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


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
