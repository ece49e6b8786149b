#!/usr/bin/env bash
# Create .venv with EFPSN and everything its runs and tests need. Idempotent and quick when done.
# Usage: scripts/setup.sh            (PYTHON=python3.11 to choose the interpreter)
#        scripts/setup.sh --fashion-mnist   also Debian's dataset-fashion-mnist (apt-get; its
#                                           60,000 + 10,000 images in /usr/share/datasets/
#                                           fashion-mnist, read by `efpsn data split --data
#                                           fashion-mnist`)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

fashion=0
for arg in "$@"; do
  case "$arg" in
    --fashion-mnist) fashion=1 ;;
    *) echo "setup: unknown argument $arg; expected --fashion-mnist or nothing" >&2; exit 2 ;;
  esac
done
if [[ "$fashion" == 1 && ! -d /usr/share/datasets/fashion-mnist ]]; then
  command -v apt-get >/dev/null 2>&1 || {
    echo "setup: --fashion-mnist installs Debian's dataset-fashion-mnist with apt-get, which this" \
         "system lacks; put the four IDX files in a folder and use --data idx:FOLDER" >&2; exit 1; }
  sudo=()
  [[ "$(id -u)" == 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q dataset-fashion-mnist
  echo "setup: Fashion-MNIST installed in /usr/share/datasets/fashion-mnist"
fi

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
