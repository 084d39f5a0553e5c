# Sourced by the entry scripts: create .venv on first use, install the package into it.
# Re-installs only when setup.py changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TCUTILS_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
STAMP="$VENV/.tcutils-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ] || [ "$ROOT/scripts/_venv.sh" -nt "$STAMP" ]; then
    # plot too: the suite then tests the charts (--plot) instead of skipping them.
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[all,plot]"
    touch "$STAMP"
fi
# The optional native helpers and the CUDA plugin (cmake/), after the install above so that the CUDA
# toolkit of the `cuda` extra (in `all`) is there: incremental, a few seconds when up to date. Without
# cmake or a C++ compiler the package runs on its pure-Python paths (and without CUDA code generation).
if command -v cmake >/dev/null 2>&1 && { command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; }; then
    bash "$ROOT/scripts/build_native.sh" "$VENV/bin/python" >/dev/null \
        || echo "note: the native helpers did not build (optional; scripts/build_native.sh shows why)" >&2
fi
export PATH="$VENV/bin:$PATH"
