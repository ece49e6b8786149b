#!/usr/bin/env bash
# Regenerate the Python stubs in efpsn/wire/v1 from proto/efpsn/wire/v1/*.proto (idempotent).
#
# Usage: scripts/gen_proto.sh        (from any directory; PYTHON=... to pick the interpreter)
# tests/test_wire.py fails when the committed stubs differ from what this script produces.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
  python="$(command -v python3)"
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cd "$root"
# Generate into a scratch directory first, so a protoc error leaves the committed stubs intact.
"$python" -m grpc_tools.protoc -I proto \
  --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" \
  proto/efpsn/wire/v1/*.proto

rm -f efpsn/wire/v1/*_pb2.py efpsn/wire/v1/*_pb2.pyi efpsn/wire/v1/*_pb2_grpc.py
cp "$out"/efpsn/wire/v1/*_pb2.py "$out"/efpsn/wire/v1/*_pb2.pyi "$out"/efpsn/wire/v1/*_pb2_grpc.py \
  efpsn/wire/v1/
echo "regenerated $(ls "$out"/efpsn/wire/v1 | wc -l) files in efpsn/wire/v1"
