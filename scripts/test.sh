#!/usr/bin/env bash
# Run the test suite (creates and fills .venv on first use). Extra arguments go to pytest.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
bash "$ROOT/scripts/install_hexagon_tools.sh"
exec "$VENV/bin/python" -m pytest python_tests "$@"
