#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine, then runs lint, types and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# The real-engine tier (pytest -m vllm): vLLM on the CPU in its own venv, a no-op once
# there. Mostly downloads, so it runs beside install-tools.sh's builds, which are mostly CPU.
vllm_log="${TMPDIR:-/tmp}/laneway-install-vllm.log"
bash scripts/install-vllm.sh >"$vllm_log" 2>&1 &
vllm_install=$!
bash scripts/install-tools.sh
export PATH="$PWD/.tools/bin:$PATH"
[ -x .venv/bin/python ] || python3 -m venv .venv
# Console scripts, not `python -m`: with the repo root first on sys.path, the operator/
# folder would shadow the standard library's operator module.
.venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh
if ! wait "$vllm_install"; then
    cat "$vllm_log" >&2
    echo "scripts/install-vllm.sh failed (its output above)" >&2
    exit 1
fi
cat "$vllm_log"
# SGLang's argument parser (pytest -m sglang), on the vLLM venv's torch: after it.
bash scripts/install-sglang.sh
# Every tier runs, the real-vLLM one included (docs/TESTING.md); arguments go to pytest.
.venv/bin/pytest "$@"
