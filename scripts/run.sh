#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: a local 5-agent EFPSN network training MNIST
# logistic regression. Extra arguments go to `efpsn up` (e.g. --iterations 2000).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec "$root/.venv/bin/efpsn" up "$@"
