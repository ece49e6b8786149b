#!/usr/bin/env bash
# Mutation testing of one pure module against its own test files, in a scratch copy of the tree
# (nothing is written to the repository). Not part of CI: minutes per module.
# Usage: scripts/mutation.sh MODULE [--sample N | --all-mutants] [--jobs J]
#        MODULE: a module mapped in pyproject.toml [tool.efpsn.mutation] (efpsn/crypto/encoding.py,
#        efpsn.crypto.encoding or encoding), or `all` for every mapped module and one table.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec "$root/.venv/bin/python" "$root/scripts/mutation.py" "$@"
