#!/usr/bin/env bash
# Builds the local Kubernetes control plane the cluster tests run against: etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler from the Go modules pinned in
# e2e/controlplane/go.mod, and KWOK (which plays nodes and pods) from e2e/controlplane/kwok.
# No registry ships these binaries, so they are built once and cached outside the checkout,
# keyed by the pinned versions, where a fresh clone on the same machine finds them.
#
#   scripts/controlplane.sh build   build what is missing, print the binaries' folder
#   scripts/controlplane.sh dir     print the binaries' folder (built or not)
#   scripts/controlplane.sh pin     after a change to e2e/controlplane/go.mod: pin every module
#                                   KWOK shares with it to its version there, so that KWOK's
#                                   build reuses the packages already compiled
#                                   (minutes less on a fresh machine)
set -euo pipefail
cd "$(dirname "$0")/.."
module="$PWD/e2e/controlplane"

# The versions and a hash of the module files and of this script (its build flags) name the
# cache folder: any change to them builds a new set.
version_of() {
    awk -v m="$1" '{ for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' "$2"
}
k8s=$(version_of k8s.io/kubernetes "$module/go.mod")
etcd=$(version_of go.etcd.io/etcd/server/v3 "$module/go.mod")
kwok=$(version_of sigs.k8s.io/kwok "$module/kwok/go.mod")
sums=$(cat "$module"/go.mod "$module"/go.sum "$module"/kwok/go.mod "$module"/kwok/go.sum \
    scripts/controlplane.sh | sha256sum | cut -c1-12)
bin="${LANEWAY_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/laneway/controlplane}/k8s-$k8s-etcd-$etcd-kwok-$kwok-$sums"

pin() {
    command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
    local main kwok_versions pins
    export LC_ALL=C # join needs the order sort gives
    main=$(cd "$module" && go list -m -f '{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' all | sort)
    # KWOK's own requirements, without the pins of an earlier run.
    sed -i '/^\/\/ Every module it shares/,$d' "$module/kwok/go.mod"
    (cd "$module/kwok" && go mod tidy)
    kwok_versions=$(cd "$module/kwok" && go list -m -f '{{.Path}} {{.Version}}' all | sort)
    pins=$(join <(echo "$main") <(echo "$kwok_versions") | awk '$2 != "" && $2 != $3 { print "\t" $1 " => " $1 " " $2 }')
    {
        echo "// Every module it shares with ../go.mod at that module's version, so that the packages"
        echo "// the Kubernetes binaries compiled are reused from Go's build cache, not compiled again."
        echo "replace ("
        echo "$pins"
        echo ")"
    } >>"$module/kwok/go.mod"
    (cd "$module/kwok" && go mod tidy)
}

case "${1:-build}" in
dir)
    echo "$bin"
    exit 0
    ;;
pin)
    pin
    exit 0
    ;;
build) ;;
*)
    echo "usage: $0 build|dir|pin" >&2
    exit 2
    ;;
esac

binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
missing=0
for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || missing=1; done
if [ "$missing" = 0 ]; then
    echo "$bin"
    exit 0
fi

command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null 2>&1; then
    echo "controlplane: no Go toolchain; cannot build the control plane" >&2
    exit 1
fi

# Build into a scratch folder and move it into place whole, so that an interrupted build
# never leaves a half-filled cache folder that looks complete.
mkdir -p "$(dirname "$bin")"
work=$(mktemp -d "$(dirname "$bin")/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
echo "controlplane: building Kubernetes $k8s, etcd $etcd, KWOK $kwok (a first build takes a while)" >&2
# -trimpath and no symbol tables keep the binaries small; the Go build cache and module
# cache make a rebuild after a version bump cost only what changed.
flags=(-trimpath -buildvcs=false -ldflags='-s -w')
# The version a release build stamps in: without it the API server says v0.0.0-master and
# Helm refuses the chart's kubeVersion.
minor=${k8s#v1.}
minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=clean"
done
(cd "$module" && CGO_ENABLED=0 go build "${flags[@]:0:2}" -ldflags="-s -w$stamp" -o "$work/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler)
(cd "$module" && CGO_ENABLED=0 go build "${flags[@]}" -o "$work/etcd" go.etcd.io/etcd/server/v3)
(cd "$module/kwok" && CGO_ENABLED=0 go build "${flags[@]}" -o "$work/kwok" sigs.k8s.io/kwok/cmd/kwok)
rm -rf "$bin"
mv "$work" "$bin"
trap - EXIT
# Each set is a few hundred MB: keep the three newest (other checkouts on this machine may
# pin other versions), drop older ones.
find "$(dirname "$bin")" -mindepth 1 -maxdepth 1 -type d -name 'k8s-*' -printf '%T@ %p\n' |
    sort -rn | tail -n +4 | cut -d' ' -f2- | xargs -r rm -rf
echo "controlplane: built in $(($(date +%s) - started)) s into $bin" >&2
echo "$bin"
