#!/usr/bin/env bash
# The tensor-core GPU check in one call, made to fit a 15-minute lease of the device tool's GPU machine
# (Python 3.12 with numpy and torch there, CUDA 13 and its driver, no network, no TVM).
#
#   bash scripts/gpu_check.sh pack       # here: fill .gpu/ (ignored by git, carried by the device tool):
#                                        # the TVM wheel's Python package and libLLVM.so (xz), the built
#                                        # plugins (cmake/build), the wheels of decorator (TVM) and
#                                        # tornado (RPC tracker), xgboost-cpu unpacked (xz): the tune
#                                        # parts' XGBTuner and local runner
#   bash scripts/gpu_check.sh            # there (or here, as a rehearsal without a GPU): unpack .gpu/ into
#                                        # $TCUTILS_GPU_WORK, run the GPU tests and scripts/gpu_check.py once
#                                        # per part (PARTS="resnet50 layers ..." picks them), write the log,
#                                        # the pytest log and one JSON per part to $OUT (default gpu-out/)
#
# PYTHON picks the interpreter (default python3). Without a GPU every step runs up to the first kernel
# launch and says so: that is the rehearsal. Exit status: 0 when every step passed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PACK="$ROOT/.gpu"
MODE="${1:-run}"
cd "$ROOT"

if [ "$MODE" = "pack" ]; then
    set -e
    source "$ROOT/scripts/_venv.sh"
    SITE="$("$VENV/bin/python" -c 'import os, tvm; print(os.path.dirname(os.path.dirname(tvm.__file__)))')"
    mkdir -p "$PACK/whl"
    # The wheel's sources, headers and other-language bindings are not needed to run: 20 MB instead of 45.
    tar -C "$SITE" -cf - --exclude='tvm/src' --exclude='tvm/include' --exclude='tvm/3rdparty' \
        --exclude='tvm/web' --exclude='tvm/jvm' --exclude='tvm/rust' --exclude='tvm/golang' \
        --exclude='__pycache__' --exclude='tvm/libtvm_runtime.so' tvm | xz -T2 -6 > "$PACK/tvm.tar.xz"
    [ -f "$PACK/llvm.tar.xz" ] && [ "$PACK/llvm.tar.xz" -nt "$SITE/llvm/lib/libLLVM.so" ] \
        || tar -C "$SITE" -cf - llvm/__init__.py llvm/lib/libLLVM.so | xz -T2 -6 > "$PACK/llvm.tar.xz"
    cp "$ROOT/cmake/build/libtvm_tcutils_cuda.so" "$ROOT/cmake/build/libtvm_tcutils_native.so" "$PACK/"
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$PACK/whl" "decorator>=5" 2>/dev/null
    # TVM's RPC tracker, which AutoTVM's local runner starts (the GPU machine has no tornado).
    TORNADO="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tornado"))')"
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$PACK/whl" "tornado==$TORNADO"
    # XGBTuner's model (the GPU machine has no xgboost): the CPU-only wheel of this machine's version, for 3.12,
    # unpacked and xz-compressed (3.6 MB instead of the wheel's 5.6: the carried tree's limit is 64 MiB).
    XGB="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("xgboost"))')"
    TMPX="$(mktemp -d)"
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$TMPX" "xgboost-cpu==$XGB"
    mkdir "$TMPX/site" && "$VENV/bin/python" -m zipfile -e "$TMPX"/xgboost_cpu-*.whl "$TMPX/site"
    tar -C "$TMPX/site" -cf - . | xz -T2 -9 > "$PACK/xgboost.tar.xz"
    rm -rf "$TMPX"
    du -ch "$PACK"/* "$PACK"/whl/* | tail -1
    exit 0
fi

[ "$MODE" = "run" ] && [ $# -gt 0 ] && shift  # the rest goes to scripts/gpu_check.py
PY="${PYTHON:-python3}"
WORK="${TCUTILS_GPU_WORK:-/tmp/tcutils-gpu}"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT" "$WORK"
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
echo "== gpu_check $(date -u +%FT%TZ) on $(hostname): $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv

# Unpacked again whenever the pack changed: a machine still warm from an earlier call keeps $WORK, and a
# wheel added to .gpu/ since (tornado, once) was not unpacked when only libtvm.so's presence was checked.
STAMP="$(cd "$PACK" && ls -lR --time-style=+%s . 2>/dev/null | sha256sum | cut -c1-16)"
if [ ! -f "$WORK/site/tvm/libtvm.so" ] || [ "$(cat "$WORK/site/.pack-stamp" 2>/dev/null)" != "$STAMP" ]; then
    rm -rf "$WORK/site"
    mkdir -p "$WORK/site"
    for archive in "$PACK/tvm.tar.xz" "$PACK/llvm.tar.xz" "$PACK/xgboost.tar.xz"; do
        [ -f "$archive" ] || { echo "error: $archive missing: run 'bash scripts/gpu_check.sh pack' first"; exit 2; }
        xz -dc -T0 "$archive" | tar -C "$WORK/site" -xf -
    done
    for wheel in "$PACK"/whl/*.whl; do "$PY" -m zipfile -e "$wheel" "$WORK/site"; done
    # numpy and ml_dtypes initialize before libtvm.so is loaded (an earlier TVM build crashed in ml_dtypes'
    # module init when it came after libtvm.so; shared/notes/gpu-tvm-build.md).
    printf 'try:\n    import numpy, ml_dtypes  # noqa\nexcept ImportError:\n    pass\n' > "$WORK/site/sitecustomize.py"
    echo "$STAMP" > "$WORK/site/.pack-stamp"
fi
export PYTHONPATH="$WORK/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TVM_TCUTILS_CUDA_PLUGIN="$PACK/libtvm_tcutils_cuda.so" TVM_TCUTILS_NATIVE="$PACK/libtvm_tcutils_native.so"
export PYTHONUNBUFFERED=1 TORCH_PYTHON="${TORCH_PYTHON:-$PY}"
# The machine's CUDA (its nvcc, NVRTC and headers) unless CUDA_PATH says otherwise; only a whole one (a CPU
# machine here had a /usr/local/cuda with headers but without NVRTC's builtins, where every compile failed).
[ -z "${CUDA_PATH:-}" ] && [ -f /usr/local/cuda/include/cuda.h ] \
    && compgen -G "/usr/local/cuda/lib*/libnvrtc-builtins.so*" >/dev/null && export CUDA_PATH=/usr/local/cuda

status=0
"$PY" -c "import tvm_tcutils, json; from tvm_tcutils import cuda; print(json.dumps(cuda.status()))" \
    || { echo "error: tvm_tcutils does not import here"; exit 3; }

# The GPU tests (bit-exact against numpy) run while ResNet-50 builds on the CPU; timings wait for them.
rm -f "$WORK/pytest.done"
( "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --timeout=400 -rs \
      python_tests/tensorcore/test_numerics.py python_tests/tensorcore/test_mma_gemm.py \
      python_tests/tensorcore/test_mma_conv2d.py \
      python_tests/tensorcore/test_wgmma_gemm.py python_tests/tensorcore/test_encoder_cuda.py python_tests/test_cuda.py \
      python_tests/test_cuda_subbyte.py > "$OUT/pytest.log" 2>&1
  echo $? > "$WORK/pytest.rc"; touch "$WORK/pytest.done" ) &
tests=$!

# One process per part (PARTS, default all): a crash in one (a segfault was seen once in the resnet50 part
# after the dense part had run in the same process) loses that part only. Each writes its own JSON.
# A part killed by SIGSEGV runs once more under cuda-gdb (it debugs host code too; gdb is not on the GPU
# machine) for the native stack, when CRASH_BT_S seconds (default 0: off) are still left to it.
for part in ${PARTS:-resnet50 layers dense bert profile int4_probe int4_cast int4 stem}; do
    "$PY" "$ROOT/scripts/gpu_check.py" --parts "$part" --json "$OUT/gpu_check_$part.json" \
        --wait-for "$WORK/pytest.done" "$@"
    rc=$?
    [ "$rc" = 0 ] && continue
    echo "== part $part: exit $rc"
    status=1
    if [ "$rc" = 139 ] && [ "${CRASH_BT_S:-0}" -gt 60 ] && command -v cuda-gdb >/dev/null; then
        echo "== part $part again under cuda-gdb (at most ${CRASH_BT_S} s)"
        timeout "$CRASH_BT_S" cuda-gdb -q -batch -ex run -ex bt -ex "info sharedlibrary tcutils" \
            --args "$PY" "$ROOT/scripts/gpu_check.py" --parts "$part" --json "$OUT/gpu_check_${part}_gdb.json" "$@" \
            2>&1 | grep -v '^\[New Thread\|^\[Thread .* exited' | tail -n 80
    fi
done
wait "$tests"
echo "== pytest: exit $(cat "$WORK/pytest.rc"); last lines:"
tail -n 15 "$OUT/pytest.log"
[ "$(cat "$WORK/pytest.rc")" = "0" ] || status=1
echo "== gpu_check done: exit $status"
exit $status
