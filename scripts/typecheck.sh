#!/usr/bin/env bash
# mypy and import-linter cannot follow setuptools' package-dir mapping (gateway/ is
# laneway.gateway, bench/ laneway.bench), so both check a tree of links laid out as the
# installed package is: mypy the types, import-linter the walls between packages
# (the contracts in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck
rm -rf "$tree"
mkdir -p "$tree/laneway"
for path in laneway/*; do
    ln -s "../../$path" "$tree/laneway/"
done
for component in gateway operator simulator bench; do
    ln -s "../../$component" "$tree/laneway/$component"
done
.venv/bin/mypy "$@"
(cd "$tree" && PYTHONPATH=. ../.venv/bin/lint-imports --no-cache ../pyproject.toml)
