#!/usr/bin/env bash
# Regenerate the Python protobuf, gRPC and mypy stubs for every .proto under protos/.
# Usage: hack/gen-protos.sh [OUTPUT_ROOT]   (default: the repository root, i.e. driversdk/pb/)
# tests/sdk/test_protos.py regenerates into a temp dir and fails when the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mkdir -p "${1:-.}" && cd "${1:-.}" && pwd)"
mkdir -p "$out/driversdk/pb"
mapfile -t protos < <(cd protos && find . -name '*.proto' | sed 's|^\./||' | LC_ALL=C sort)
cd protos
python3 -m grpc_tools.protoc -I . \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  "${protos[@]}"
[ -f "$out/driversdk/pb/__init__.py" ] || : > "$out/driversdk/pb/__init__.py"
