#!/usr/bin/env bash
# Installs SGLang's argument parser for the `sglang` test tier (tests/test_sglang_flags.py):
# the SGLang release the operator's image runs, in its own venv under the user's cache.
# Idempotent: it does nothing when the venv already holds the pinned version.
#
# Only the parser, not a server: SGLang's requirements are GPU builds (its kernels, CUDA's
# torch), and the parser needs none of them. So sglang goes in with --no-deps, plus the three
# packages its server_args module imports that vLLM's venv lacks, and the rest (torch,
# transformers, numpy...) comes from the vLLM tier's venv, named by a .pth file after this
# venv's own site-packages. Run it after scripts/install-vllm.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# The operator's image for SGLang pools is lmsysorg/sglang:v$SGLANG_VERSION (operator/render.py).
SGLANG_VERSION="${SGLANG_VERSION:-0.5.4}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/laneway"
VENV="${SGLANG_VENV:-$CACHE/sglang/venv-$SGLANG_VERSION}"
VLLM_VENV="${VLLM_VENV:-$CACHE/vllm/venv-${VLLM_VERSION:-0.32.0}}"
PY=("$VENV/bin/python" -P)

importable() {
    [ -x "$VENV/bin/python" ] && "${PY[@]}" - "$SGLANG_VERSION" <<'PY' 2>/dev/null
import argparse, importlib.metadata as md, sys
from sglang.srt.server_args import ServerArgs
ServerArgs.add_cli_args(argparse.ArgumentParser())
sys.exit(0 if md.version("sglang") == sys.argv[1] else 1)
PY
}

if importable; then
    echo "install-sglang: sglang $SGLANG_VERSION's parser already in $VENV"
    exit 0
fi
site_of() { "$1/bin/python" -P -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x "$VLLM_VENV/bin/python" ]; then
    echo "install-sglang: no vLLM venv in $VLLM_VENV (scripts/install-vllm.sh makes it)" >&2
    exit 1
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"${PY[@]}" -m pip install -q --disable-pip-version-check --no-deps \
    "sglang==$SGLANG_VERSION" "ipython==9.18.1" "traitlets==5.16.1" "orjson==3.13.0"
site_of "$VLLM_VENV" >"$(site_of "$VENV")/zz-laneway-vllm-venv.pth"
importable || { echo "install-sglang: sglang $SGLANG_VERSION's parser not importable" >&2; exit 1; }
echo "install-sglang: sglang $SGLANG_VERSION's parser installed in $VENV"
