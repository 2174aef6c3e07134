#!/usr/bin/env bash
# Runs every laneway role the way the chart runs the image: as user 10001, every filesystem
# read-only (stricter than the chart, which mounts an emptyDir on /tmp), no capabilities, no
# privilege escalation. Checks that each role starts and serves:
#   laneway --version; `laneway sim` answering /health; `laneway gateway` in front of that
#   engine answering a chat completion in the interactive lane; `laneway operator` serving
#   /healthz while it retries a cluster that is not there;
# and that no role logged a write it was refused.
#   scripts/image-smoke.sh --image IMAGE   the built image, under docker (host network)
#   scripts/image-smoke.sh --venv DIR      DIR laid out as the image's /opt/laneway, on this
#                                          host's Python, in a mount namespace where every
#                                          filesystem is remounted read-only (needs root,
#                                          unshare and setpriv from util-linux)
# Prints the version line on stdout; progress and failures go to stderr.
set -euo pipefail

say() { echo "image-smoke: $*" >&2; }
usage() { echo "usage: $0 --image IMAGE | --venv DIR" >&2; exit 2; }

[ $# -eq 2 ] || usage
mode=$1
target=$2
case "$mode" in
    --image) command -v docker >/dev/null || { say "docker is missing"; exit 2; } ;;
    --venv)
        [ -x "$target/bin/laneway" ] || { say "$target/bin/laneway is missing"; exit 2; }
        target=$(cd "$target" && pwd)
        ;;
    *) usage ;;
esac

work=$(mktemp -d)
chmod 755 "$work"
roles=()  # roles[i] runs as containers[i] (--image) or pids[i] (--venv)
containers=()
pids=()
cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for name in "${containers[@]}"; do docker rm --force "$name" >/dev/null 2>&1 || true; done
    if [ "$status" != 0 ]; then
        for log in "$work"/*.log; do
            [ -e "$log" ] && { say "--- $(basename "$log")"; tail -n 20 "$log" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# The image's environment (Dockerfile, final stage), for --venv; the image carries its own.
image_env=(
    "PATH=$target/bin:/usr/local/bin:/usr/bin:/bin"
    PYTHONUNBUFFERED=1
    PYTHONDONTWRITEBYTECODE=1
    TIKTOKEN_CACHE_DIR=
    USER=laneway
    HOME=/nonexistent
)
# Inside the namespace: every mount read-only, then laneway as 10001 with nothing inherited.
# (Single quotes on purpose: the inner shell expands it.)
# shellcheck disable=SC2016
readonly_exec='
for mount in $(awk "{print \$2}" /proc/self/mounts | grep -Ev "^/(proc|sys|dev)(/|$)"); do
    mount -o remount,bind,ro "$mount"
done
cd /
exec setpriv --reuid 10001 --regid 10001 --clear-groups --no-new-privs \
    --inh-caps=-all --bounding-set=-all env -i "$@"'

# laneway ARGS: run one laneway command in the foreground.
laneway() {
    if [ "$mode" = --image ]; then
        docker run --rm "${docker_flags[@]}" "$target" "$@"
    else
        unshare --mount --propagation private -- sh -c "$readonly_exec" sh \
            "${image_env[@]}" "KUBECONFIG=$work/kubeconfig" laneway "$@"
    fi
}

# start NAME ARGS: run one laneway command in the background, its output in $work/NAME.log.
start() {
    local name=$1
    shift
    roles+=("$name")
    if [ "$mode" = --image ]; then
        local container="laneway-smoke-$$-$name"
        containers+=("$container")
        docker run --detach --name "$container" "${docker_flags[@]}" "$target" "$@" >/dev/null
    else
        # unshare, sh, setpriv and env each exec the next: $! ends up as laneway's pid.
        unshare --mount --propagation private -- sh -c "$readonly_exec" sh \
            "${image_env[@]}" "KUBECONFIG=$work/kubeconfig" laneway "$@" >"$work/$name.log" 2>&1 &
        pids+=($!)
    fi
}

collect_logs() {
    local container
    for container in "${containers[@]}"; do
        docker logs "$container" >"$work/${container##*-}.log" 2>&1 || true
    done
}

# all_running: exit 1 naming the first role that is no longer running.
all_running() {
    local index
    for index in "${!roles[@]}"; do
        if [ "$mode" = --image ]; then
            [ "$(docker inspect --format '{{.State.Running}}' "${containers[$index]}")" = true ] \
                && continue
        else
            kill -0 "${pids[$index]}" 2>/dev/null && continue
        fi
        collect_logs
        say "${roles[$index]} exited"
        exit 1
    done
}

# wait_for URL: until it answers 200, at most 60 s, while every role runs.
wait_for() {
    local deadline=$((SECONDS + 60))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ]; do
        all_running
        if [ "$SECONDS" -ge "$deadline" ]; then
            collect_logs
            say "no 200 from $1 within 60 s"
            exit 1
        fi
        sleep 0.5
    done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

docker_flags=(
    --read-only --user 10001:10001 --cap-drop ALL --security-opt no-new-privileges
    --network host --volume "$work:$work:ro" --env "KUBECONFIG=$work/kubeconfig"
)

version=$(laneway --version) || { say "laneway --version failed"; exit 1; }
case "$version" in
    "laneway "*) say "runs: $version" ;;
    *) say "laneway --version printed '$version'"; exit 1 ;;
esac

sim_port=$(free_port)
gateway_port=$(free_port)
operator_port=$(free_port)
cat >"$work/gateway.yaml" <<EOF
apiVersion: laneway.io/v1alpha1
kind: InferencePool
metadata:
  name: smoke
spec:
  lane: interactive
  model: smoke
  engine:
    kind: simulator
status:
  endpoints: ["http://127.0.0.1:$sim_port"]
EOF
# A cluster that is not there: the operator must start, serve /healthz and keep retrying.
cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:$(free_port)"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
EOF
chmod 644 "$work/gateway.yaml" "$work/kubeconfig"

start sim sim --host 127.0.0.1 --port "$sim_port" --model smoke --profile zero
start gateway gateway --config "$work/gateway.yaml" --host 127.0.0.1 --port "$gateway_port"
start operator operator --namespace default --health-port "$operator_port"

wait_for "http://127.0.0.1:$sim_port/health"
say "sim serves /health"
wait_for "http://127.0.0.1:$gateway_port/readyz"
headers=$(curl -s -D - -o "$work/answer.json" -H 'content-type: application/json' \
    -d '{"model": "smoke", "messages": [{"role": "user", "content": "hello"}]}' \
    "http://127.0.0.1:$gateway_port/v1/chat/completions")
if ! grep -qi '^x-laneway-lane: interactive' <<<"$headers" || ! grep -q '"choices"' "$work/answer.json"; then
    collect_logs
    say "the gateway did not answer a chat completion through the interactive lane:"
    echo "$headers" >&2
    exit 1
fi
say "gateway routes a chat completion to the sim"
wait_for "http://127.0.0.1:$operator_port/healthz"
say "operator serves /healthz"

collect_logs
for role in sim gateway operator; do
    if grep -E 'Read-only file system|Permission denied|PermissionError' "$work/$role.log" >&2; then
        say "$role tried to write where the image cannot"
        exit 1
    fi
done
# Still running: none of them gave up on the read-only filesystem after answering.
all_running
say "every role runs as 10001 on a read-only filesystem"
echo "$version"
