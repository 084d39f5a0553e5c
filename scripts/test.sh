#!/usr/bin/env bash
# Run the linter and the test suite (creates and fills .venv on first use). Extra arguments go to pytest.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
bash "$ROOT/scripts/install_hexagon_tools.sh"
# Graphviz's dot draws Collage's partition pictures; best effort, like the Hexagon tools (the picture tests
# skip with the reason when it is still missing).
if ! command -v dot >/dev/null && command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
    ($SUDO apt-get install -y -qq graphviz || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq graphviz; }) \
        >/dev/null 2>&1 || echo "test.sh: apt-get could not install graphviz; picture tests will skip" >&2
fi
# Which interpreter and which TVM this run used: a CI log is read long after the machine is gone.
"$VENV/bin/python" - <<'PY'
import os, sys
print(f"python {sys.version.split()[0]} at {sys.executable}")
try:
    import tvm
    print(f"tvm {tvm.__version__} at {os.path.dirname(tvm.__file__)}")
except ImportError as err:
    print(f"tvm: not importable ({err})")
PY
# Lint first, but run the tests either way: both results in one run; the status is the worse one.
lint=0
"$VENV/bin/python" -m ruff check --output-format concise tvm_tcutils python_tests scripts || lint=$?
tests=0
# Two processes: the suite is mostly single-threaded compilation (TCUTILS_TEST_WORKERS=0: one process;
# three were slower on 2 cores). loadfile keeps a file's tests on one worker, so module-scoped fixtures
# (the int8 sweep) are built once; files go out in collection order, the slowest first
# (python_tests/conftest.py: SLOW_FILES).
# A worker that dies (SIGILL from code built for another CPU, say) ends the run at once, named: a replaced
# worker once left xdist's loadfile scheduler waiting forever on a Zen 3 (CI's limit, not an answer).
workers="${TCUTILS_TEST_WORKERS:-2}"
restart=(); [ "$workers" != 0 ] && restart=(--max-worker-restart=0)
"$VENV/bin/python" -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "${restart[@]}" "$@" || tests=$?  # testpaths: python_tests and the package's doctests
if [ "$tests" -ne 0 ]; then exit "$tests"; fi
if [ "$lint" -ne 0 ]; then echo "ruff check failed (see above)" >&2; fi
exit "$lint"
