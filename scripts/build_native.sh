#!/usr/bin/env bash
# Build the optional native helper library (cmake/) against the TVM found by the given python.
# Usage: scripts/build_native.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
TVM_DIR="$("$PY" -c 'import os, tvm; print(os.path.dirname(tvm.__file__))')"
BUILD="${TCUTILS_NATIVE_BUILD:-$ROOT/cmake/build}"
cmake -S "$ROOT/cmake" -B "$BUILD" -DTVM_PYTHON_DIR="$TVM_DIR" >/dev/null
cmake --build "$BUILD" -j 2 >/dev/null
echo "$BUILD/libtvm_tcutils_native.so"
