#!/usr/bin/env bash
# mypy cannot follow setuptools' package-dir mapping (gateway/ is laneway.gateway), so it
# checks a tree of links laid out as the installed package is.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck
rm -rf "$tree"
mkdir -p "$tree/laneway"
for path in laneway/*; do
    ln -s "../../$path" "$tree/laneway/"
done
for component in gateway operator simulator; do
    ln -s "../../$component" "$tree/laneway/$component"
done
exec .venv/bin/mypy "$@"
