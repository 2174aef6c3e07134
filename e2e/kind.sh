#!/usr/bin/env bash
# A kind cluster running laneway from this checkout: the image built here, loaded into the
# cluster, and the Helm chart installed (without its example pools; e2e/test_kind.py applies
# manifests/examples/simulator-pools.yaml itself).
#   e2e/kind.sh up      create the cluster (or reuse it), build + load the image, install
#   e2e/kind.sh down    delete the cluster
# Needs docker (with a running engine), kind, kubectl and helm. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=${LANEWAY_E2E_CLUSTER:-laneway-e2e}
namespace=${LANEWAY_E2E_NAMESPACE:-laneway}
tag=e2e
release=laneway

say() { echo "e2e/kind.sh: $*" >&2; }

helm=$(command -v helm || true)
[ -n "$helm" ] || helm=.tools/bin/helm

require() {
    local missing=()
    for tool in docker kind kubectl; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    [ -x "$helm" ] || missing+=(helm)
    if [ ${#missing[@]} -gt 0 ]; then
        say "missing: ${missing[*]}"
        exit 3
    fi
    if ! docker info >/dev/null 2>&1; then
        say "the Docker engine is not reachable (docker info failed)"
        exit 3
    fi
}

up() {
    require
    if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
        say "reusing cluster $cluster"
    else
        say "creating cluster $cluster"
        kind create cluster --name "$cluster" --wait 180s >&2
    fi
    kubectl config use-context "kind-$cluster" >&2
    say "building image laneway:$tag"
    docker build --tag "laneway:$tag" . >&2
    say "loading the image into the cluster"
    kind load docker-image "laneway:$tag" --name "$cluster" >&2
    say "installing the chart into namespace $namespace"
    # Small requests: a kind node is one machine. The operator starts simulator pools from
    # the same image (LANEWAY_IMAGE), already on the node.
    "$helm" upgrade --install "$release" charts/laneway \
        --namespace "$namespace" --create-namespace \
        --set image.tag="$tag" \
        --set image.pullPolicy=Never \
        --set examplePools.enabled=false \
        --set gateway.resources.requests.cpu=100m \
        --set gateway.resources.requests.memory=128Mi \
        --set operator.resources.requests.cpu=50m \
        --set operator.resources.requests.memory=64Mi >&2
    # Not `helm --wait`: the gateway reports ready (/readyz) only once a pool has an
    # endpoint, and the tests apply the pools. The operator must be up before they do.
    kubectl --namespace "$namespace" rollout status deployment/"$release"-operator --timeout=300s >&2
    # Helm never upgrades crds/: apply it so a reused cluster runs this checkout's CRD.
    kubectl apply -f charts/laneway/crds/laneway.io_inferencepools.yaml >&2
    say "ready: release $release in namespace $namespace on kind-$cluster"
}

down() {
    if command -v kind >/dev/null 2>&1; then
        say "deleting cluster $cluster"
        kind delete cluster --name "$cluster" >&2
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
