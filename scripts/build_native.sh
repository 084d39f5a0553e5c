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
#     (a source tree of that version), else TVM_SOURCE_ARCHIVE (its .tar.xz), else the project's copy in
#     ../shared/tvm-cuda/tvm-v<version>-src.tar.xz. Without them it is skipped with a note.
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
if [ -z "$SOURCE" ]; then
    ARCHIVE="${TVM_SOURCE_ARCHIVE:-$ROOT/../shared/tvm-cuda/tvm-v$TVM_VERSION-src.tar.xz}"
    if [ -f "$ARCHIVE" ]; then
        # Only the headers: a few seconds, once per build folder.
        if [ ! -f "$BUILD/tvm-src/tvm/include/tvm/ir/module.h" ]; then
            rm -rf "$BUILD/tvm-src" && mkdir -p "$BUILD/tvm-src"
            tar -xJf "$ARCHIVE" -C "$BUILD/tvm-src" tvm/include tvm/3rdparty/dlpack/include \
                tvm/3rdparty/dmlc-core/include
        fi
        SOURCE="$BUILD/tvm-src/tvm"
    fi
fi
if [ -z "$CUDA_ROOT" ]; then
    echo "note: no CUDA toolkit found: the CUDA plugin is not built (pip install 'tvm-tcutils[cuda]')" >&2
elif [ -z "$SOURCE" ] || [ ! -f "$SOURCE/include/tvm/ir/module.h" ]; then
    echo "note: no TVM $TVM_VERSION source headers found: the CUDA plugin is not built (set TVM_SOURCE_DIR)" >&2
elif [ ! -f "$TVM_DIR/src/target/opt/build_cuda_on.cc" ]; then
    echo "note: the installed TVM ships no CUDA sources (tvm/src/target/opt): the CUDA plugin is not built" >&2
else
    cuda_args=(-DTCUTILS_CUDA_ROOT="$CUDA_ROOT" -DTVM_SOURCE_DIR="$SOURCE")
fi

# The libraries depend on these inputs alone, so a clean checkout (CI) copies what an identical build
# made before instead of compiling again (~15-25 s): the sources under cmake/, the TVM and CUDA toolkit
# they build against, where the TVM headers come from, the compiler. TCUTILS_NATIVE_CACHE="" turns it off.
CACHE_ROOT="${TCUTILS_NATIVE_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/tvm-tcutils/native}"
CACHE=""
if [ -n "$CACHE_ROOT" ]; then
    HEADERS="${TVM_SOURCE_DIR:-}"
    if [ -z "$HEADERS" ] && [ -n "${ARCHIVE:-}" ] && [ -f "$ARCHIVE" ]; then
        HEADERS="$(sha256sum "$ARCHIVE" | cut -c1-64)"
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
