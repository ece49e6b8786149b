#!/usr/bin/env bash
# Create .venv with EFPSN and everything its runs and tests need. Idempotent and quick when done.
# Usage: scripts/setup.sh            (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  for cand in python3.11 python3 python; do
    if command -v "$cand" >/dev/null 2>&1; then py="$cand"; break; fi
  done
fi
[[ -n "$py" ]] || { echo "setup: no python3 found; install Python 3.11" >&2; exit 1; }
"$py" - <<'PY' || { echo "setup: EFPSN needs Python >= 3.11 (got $("$py" -V 2>&1))" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

venv="$root/.venv"
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"

# Reinstall only when the dependency declarations change.
stamp="$venv/.efpsn-installed"
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# torch is pinned by constraints.txt (a CPU build, 2.13.0) and installed first, so nothing
# later resolves it to a multi-GB CUDA build; the package itself only asks for a range.
"${pip[@]}" install -q -c constraints.txt "torch==2.13.0"
"${pip[@]}" install -q -c constraints.txt -e ".[data,plots,dev]"
echo "$want" > "$stamp"
echo "setup: environment ready in .venv"
