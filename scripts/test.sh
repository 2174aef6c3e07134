#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine, then runs lint, types and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-tools.sh
# The real-engine tier (pytest -m vllm): vLLM on the CPU in its own venv; a no-op once there.
bash scripts/install-vllm.sh
export PATH="$PWD/.tools/bin:$PATH"
[ -x .venv/bin/python ] || python3 -m venv .venv
# Console scripts, not `python -m`: with the repo root first on sys.path, the operator/
# folder would shadow the standard library's operator module.
.venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh
.venv/bin/pytest "$@"
