# Sourced by the entry scripts: create .venv on first use, install the package into it.
#
# The third-party packages (TVM, onnxruntime, OpenVINO, the CUDA toolkit wheels, ...: the `all` and `plot`
# extras) live in one environment per machine, under ~/.cache/tvm-tcutils/envs (TCUTILS_DEPS_CACHE moves
# it), keyed by setup.py, this script and the Python version: built once (about 45 s, pip's own download
# cache aside), then shared by every checkout -- CI tests a clean checkout each time. The checkout's .venv
# holds the package itself (editable, a few seconds) and sees that environment through a .pth file.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TCUTILS_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
KEY="$(cat "$ROOT/setup.py" "$ROOT/scripts/_venv.sh" | sha256sum | cut -c1-16)"
DEPS_ROOT="${TCUTILS_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tvm-tcutils/envs}"
DEPS="$DEPS_ROOT/py$PYVER-$KEY"
# Complete only once this file exists: an interrupted build is removed and built again.
DEPS_DONE="$DEPS/.tcutils-complete"
if [ ! -f "$DEPS_DONE" ]; then
    mkdir -p "$DEPS_ROOT"
    (
        flock 9  # one build at a time; a second run waits for it and then uses it
        if [ ! -f "$DEPS_DONE" ]; then
            rm -rf "$DEPS"
            "$PYTHON" -m venv "$DEPS"
            "$DEPS/bin/python" -m pip install --quiet --upgrade pip
            # plot too: the suite then tests the charts (--plot) instead of skipping them.
            "$DEPS/bin/python" -m pip install --quiet "$ROOT[all,plot]"
            "$DEPS/bin/python" -m pip uninstall --quiet -y tvm-tcutils  # each checkout installs its own
            touch "$DEPS_DONE"
        fi
    ) 9>"$DEPS_ROOT/.lock"
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
DEPS_SITE="$("$DEPS/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
# addsitedir, not a bare path line: the shared environment's own .pth files are read too. After the
# venv's own site-packages, so the checkout's package is the one imported.
echo "import site; site.addsitedir('$DEPS_SITE')" > "$SITE/tcutils-deps.pth"
STAMP="$VENV/.tcutils-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ] || [ "$ROOT/scripts/_venv.sh" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
    touch "$STAMP"
fi
# The optional native helpers and the CUDA plugin (cmake/), after the install above so that the CUDA
# toolkit of the `cuda` extra (in `all`) is there: incremental, a few seconds when up to date. Without
# cmake or a C++ compiler the package runs on its pure-Python paths (and without CUDA code generation).
if command -v cmake >/dev/null 2>&1 && { command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; }; then
    bash "$ROOT/scripts/build_native.sh" "$VENV/bin/python" >/dev/null \
        || echo "note: the native helpers did not build (optional; scripts/build_native.sh shows why)" >&2
fi
export PATH="$VENV/bin:$DEPS/bin:$PATH"
