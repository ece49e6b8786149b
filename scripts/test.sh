#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
set +e
"$root/.venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  # pytest exits 5 when it collected no test: that is a broken suite, not a pass.
  echo "test: pytest collected no tests; failing on purpose" >&2
  exit 1
fi
exit $rc
