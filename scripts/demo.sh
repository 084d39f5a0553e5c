#!/usr/bin/env bash
# Run the demo on a built-in model (creates and fills .venv on first use). Extra arguments go to the demo.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
exec "$VENV/bin/tvm-tcutils" demo "$@"
