#!/usr/bin/env bash
# Build the native plugins (cmake/) against the TVM found by the given python: the helper library
# always, the CUDA plugin where a CUDA toolkit and the installed TVM's source headers are found.
# Usage: scripts/build_native.sh [PYTHON]   (default: .venv/bin/python, else python3)
# Prints the path of each library built, one a line, the helper library last.
#
# The CUDA plugin needs:
#   - a CUDA toolkit: CUDA_PATH, else the PyPI wheels' tree (pip install 'tvm-tcutils[cuda]'), else
#     /usr/local/cuda;
#   - the headers of the TVM version installed (the wheel ships its runtime headers only): TVM_SOURCE_DIR
#     (a source tree of that version), else TVM_SOURCE_ARCHIVE (its source archive), else the project's copy
#     in ../shared/tvm-cuda/tvm-v<version>-src.tar.xz, else TVM's public release archive, downloaded once
#     and checked against its pinned SHA-256 (TCUTILS_TVM_SOURCE_URL: another address, such as a mirror).
#     Without them it is skipped with a one-line note.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
# One interpreter for the three facts (each start imports TVM: seconds).
INFO="$(cd "$ROOT" && "$PY" -c '
import os, tvm
print(os.path.dirname(tvm.__file__)); print(tvm.__version__)
try:
    from tvm_tcutils.cuda import toolkit_root
    print(toolkit_root() or "")
except Exception:  # the package cannot say: no CUDA toolkit found
    print("")
')" || INFO=""
TVM_DIR="$(sed -n 1p <<<"$INFO")"
TVM_VERSION="$(sed -n 2p <<<"$INFO")"
CUDA_ROOT="$(sed -n 3p <<<"$INFO")"
if [ -z "$TVM_DIR" ] || [ -z "$TVM_VERSION" ]; then
    echo "build_native.sh: $PY cannot import tvm" >&2
    exit 1
fi
BUILD="${TCUTILS_NATIVE_BUILD:-$ROOT/cmake/build}"
mkdir -p "$BUILD"

cuda_args=()
SOURCE="${TVM_SOURCE_DIR:-}"
if [ -z "$CUDA_ROOT" ]; then
    echo "note: no CUDA toolkit found: the CUDA plugin is not built (pip install 'tvm-tcutils[cuda]')" >&2
elif [ ! -f "$TVM_DIR/src/target/opt/build_cuda_on.cc" ]; then
    echo "note: the installed TVM ships no CUDA sources (tvm/src/target/opt): the CUDA plugin is not built" >&2
else
    if [ -z "$SOURCE" ]; then
        SOURCE="$BUILD/tvm-src/tvm"
        if [ ! -f "$SOURCE/include/tvm/ir/module.h" ]; then
            # Only the headers, once per build folder (seconds): from the archive given or the project's copy,
            # else TVM's release archive downloaded and checked against its pinned SHA-256 (tvm_tcutils/tvm_source.py).
            ARCHIVE="${TVM_SOURCE_ARCHIVE:-$ROOT/../shared/tvm-cuda/tvm-v$TVM_VERSION-src.tar.xz}"
            from=()
            if [ -f "$ARCHIVE" ]; then from=(--archive "$ARCHIVE"); fi
            # The module prints its own one-line note when it has no headers to give.
            (cd "$ROOT" && "$PY" -m tvm_tcutils.tvm_source "$TVM_VERSION" "$BUILD/tvm-src" "${from[@]}" >/dev/null) \
                || SOURCE=""
        fi
    fi
    if [ -n "$SOURCE" ] && [ -f "$SOURCE/include/tvm/ir/module.h" ]; then
        cuda_args=(-DTCUTILS_CUDA_ROOT="$CUDA_ROOT" -DTVM_SOURCE_DIR="$SOURCE")
    elif [ -n "$SOURCE" ]; then
        echo "note: $SOURCE is not a TVM $TVM_VERSION source tree (no include/tvm/ir/module.h): the CUDA plugin is not built" >&2
    fi
fi

# The libraries depend on these inputs alone, so a clean checkout (CI) copies what an identical build
# made before instead of compiling again (~15-25 s): the sources under cmake/, the TVM and CUDA toolkit
# they build against, where the TVM headers come from, the compiler. TCUTILS_NATIVE_CACHE="" turns it off.
CACHE_ROOT="${TCUTILS_NATIVE_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/tvm-tcutils/native}"
CACHE=""
if [ -n "$CACHE_ROOT" ]; then
    # What the headers came from: the tree given, else the checksum of the archive they were unpacked from.
    HEADERS="${TVM_SOURCE_DIR:-}"
    if [ -z "$HEADERS" ] && [ ${#cuda_args[@]} -gt 0 ]; then
        HEADERS="$(cat "$SOURCE/.tcutils-archive-sha256" 2>/dev/null || echo "$SOURCE")"
    fi
    KEY="$({
        (cd "$ROOT/cmake" && find . -type d -name 'build*' -prune -o -type f -print | LC_ALL=C sort | xargs cat)
        echo "$TVM_DIR $TVM_VERSION cuda=${#cuda_args[@]} $CUDA_ROOT $HEADERS"
        c++ --version 2>/dev/null || g++ --version 2>/dev/null || true
        cmake --version | head -1
    } | sha256sum | cut -c1-16)"
    CACHE="$CACHE_ROOT/$KEY"
fi
LIBS=(libtvm_tcutils_native.so)
if [ ${#cuda_args[@]} -gt 0 ]; then LIBS+=(libtvm_tcutils_cuda.so); fi
if [ -n "$CACHE" ] && [ -f "$CACHE/.complete" ]; then
    for lib in "${LIBS[@]}"; do
        # A new file renamed over the old one, never written into it: processes that have the old one
        # loaded keep their mapping (writing into a loaded library crashes them).
        if ! cmp -s "$CACHE/$lib" "$BUILD/$lib"; then
            cp -p "$CACHE/$lib" "$BUILD/.$lib.$$" && mv -f "$BUILD/.$lib.$$" "$BUILD/$lib"
        fi
    done
else
    cmake -S "$ROOT/cmake" -B "$BUILD" -DTVM_PYTHON_DIR="$TVM_DIR" -DTCUTILS_CUDA_ROOT= -DTVM_SOURCE_DIR= \
        "${cuda_args[@]}" >/dev/null
    cmake --build "$BUILD" -j 2 >/dev/null
    if [ -n "$CACHE" ]; then
        # Written aside, then renamed whole: a reader never sees a half-copied entry.
        mkdir -p "$CACHE_ROOT"
        TMP="$(mktemp -d "$CACHE_ROOT/.tmp.XXXXXX")"
        for lib in "${LIBS[@]}"; do cp -p "$BUILD/$lib" "$TMP/$lib"; done
        touch "$TMP/.complete"
        mv -T "$TMP" "$CACHE" 2>/dev/null || rm -rf "$TMP"  # another build stored the same first
    fi
fi
if [ ${#cuda_args[@]} -gt 0 ]; then
    echo "$BUILD/libtvm_tcutils_cuda.so"
else
    rm -f "$BUILD/libtvm_tcutils_cuda.so"  # a plugin from an earlier build would not match what is installed now
fi
echo "$BUILD/libtvm_tcutils_native.so"
