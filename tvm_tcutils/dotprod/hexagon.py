"""Run TVM schedules' Hexagon HVX code under user-mode emulation (clang-16 + qemu-hexagon).

TVM's LLVM here has no Hexagon backend, so this takes another route: the
schedule (built with ``mode="extern"``, whose tensorized tiles are calls to the
small C helpers below, written with HVX intrinsics such as
``Q6_Vw_vrmpyacc_VwVubVb``) is printed by TVM's C source backend; clang-16
compiles it with a freestanding harness for ``hexagonv66`` (HVX, 128-byte
vectors); ``qemu-hexagon`` runs the static binary, which reads the inputs on
stdin and writes the outputs on stdout.

Needs Debian's ``qemu-user``, ``clang-16`` and ``lld-16`` (see
:func:`tvm_tcutils._tvm.hexagon_emulator`). A whole Relay model goes the same way
with :func:`tvm_tcutils.dotprod.hexagon_model.run_model`.

Example
-------
>>> from tvm_tcutils.dotprod import hexagon as hexagon_emulation
>>> missing = hexagon_emulation.missing_tools()  # [] where all three are installed
>>> set(missing) <= {"clang", "lld", "qemu"}
True
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from typing import List, Sequence

import numpy as np

from .._tvm import hexagon_emulator, tvm
from tvm import te

#: The CPU the binaries are built for (qemu 7.2 runs v66 and v67, not v68).
CPU = "hexagonv66"

#: Tools this module runs, by :func:`hexagon_emulator` key.
TOOLS = ("clang", "lld", "qemu")

_DL_CODES = {"int": 0, "uint": 1, "float": 2}

#: HVX C intrinsic (clang's ``hvx_hexagon_protos.h``) of each LLVM intrinsic the ISA uses.
C_INTRINSICS = {
    "llvm.hexagon.V6.vrmpybusv.acc.128B": "Q6_Vw_vrmpyacc_VwVubVb",
    "llvm.hexagon.V6.vrmpyubv.acc.128B": "Q6_Vuw_vrmpyacc_VuwVubVub",
    "llvm.hexagon.V6.vrmpybv.acc.128B": "Q6_Vw_vrmpyacc_VwVbVb",
}

_C_TYPES = {"uint8": "uint8_t", "int8": "int8_t"}

#: Shared part of the helpers: unaligned HVX loads/stores and the 4-byte broadcast.
_HELPER_PRELUDE = r"""
#include <hexagon_types.h>
#include <hvx_hexagon_protos.h>
typedef long HVX_UVector __attribute__((__vector_size__(128))) __attribute__((aligned(4)));
static inline HVX_Vector tcu_splat4(const void* p) {
  const unsigned char* b = (const unsigned char*)p;
  return Q6_V_vsplat_R((int)(b[0] | (b[1] << 8) | (b[2] << 16) | ((unsigned)b[3] << 24)));
}
#define TCU_LOAD(p) (*(const HVX_UVector*)(p))
int32_t tcu_zero_i32(int32_t* acc, int32_t lanes) {
  for (int32_t i = 0; i < lanes; i++) acc[i] = 0;
  return 0;
}
"""


def helpers_source(isa=None) -> str:
    """C helpers the ``extern`` tensor intrinsics call: one ``acc[32] += dot4`` tile per variant.

    Generated from the ISA description, so the operand order (``swap``) is the one the
    LLVM path uses too.

    Examples
    --------
    >>> "tcu_vrmpy_ub_b(" in helpers_source()
    True
    """
    from .isa import HEXAGON_HVX

    lines = [_HELPER_PRELUDE]
    for var in (isa or HEXAGON_HVX).variants:
        data, kernel = "tcu_splat4(data)", "TCU_LOAD(kernel)"
        first, second = (kernel, data) if var.swap else (data, kernel)
        lines.append(
            f"int32_t {var.extern}(int32_t* acc, {_C_TYPES[var.data_dtype]}* data, "
            f"{_C_TYPES[var.kernel_dtype]}* kernel) {{\n"
            f"  *(HVX_UVector*)acc = {C_INTRINSICS[var.intrinsic]}(TCU_LOAD(acc), {first}, {second});\n"
            f"  return 0;\n}}"
        )
    return "\n".join(lines) + "\n"


#: Freestanding runtime: the few TVM backend calls generated C makes, memory helpers, syscalls.
_RUNTIME = r"""
static long tcu_syscall(long nr, long a, long b, long c) {
  register long r0 asm("r0") = a; register long r1 asm("r1") = b; register long r2 asm("r2") = c;
  register long r6 asm("r6") = nr;
  asm volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
  return r0;
}
static int tcu_io(int nr, int fd, unsigned char* buf, unsigned long n) {
  while (n) { long got = tcu_syscall(nr, fd, (long)buf, (long)n); if (got <= 0) return 1; buf += got; n -= got; }
  return 0;
}
static void tcu_exit(int code) { tcu_syscall(93, code, 0, 0); for (;;) {} }
static void tcu_say(const char* msg) {
  unsigned long n = 0; while (msg[n]) n++;
  tcu_io(64, 2, (unsigned char*)msg, n); tcu_io(64, 2, (unsigned char*)"\n", 1);
}
static unsigned char tcu_arena[TCU_ARENA] __attribute__((aligned(128)));
static unsigned long tcu_arena_top;
void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  unsigned long start = (tcu_arena_top + 127) & ~127ul;
  if (start + nbytes > sizeof(tcu_arena)) { tcu_say("TVMBackendAllocWorkspace: arena full"); return 0; }
  tcu_arena_top = start + nbytes;
  return tcu_arena + start;
}
/* Generated code frees its workspaces in the reverse order of allocation, so a free releases
   the block and everything above it: a loop allocating per iteration reuses the same bytes. */
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  unsigned char* p = ptr;
  if (p >= tcu_arena && p < tcu_arena + tcu_arena_top) tcu_arena_top = (unsigned long)(p - tcu_arena);
  return 0;
}
/* A failed check in generated code (shape, dtype...) says why on stderr. */
void TVMAPISetLastError(const char* msg) { tcu_say(msg); }
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  TVMParallelGroupEnv env = {0, 1};
  return flambda(0, &env, cdata);
}
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) { return 0; }
void* memset(void* dst, int value, unsigned long n) {
  unsigned char* d = dst; while (n--) *d++ = (unsigned char)value; return dst;
}
void* memcpy(void* dst, const void* src, unsigned long n) {
  unsigned char* d = dst; const unsigned char* s = src; while (n--) *d++ = *s++; return dst;
}
void* memmove(void* dst, const void* src, unsigned long n) {
  unsigned char* d = dst; const unsigned char* s = src;
  if (d < s) { while (n--) *d++ = *s++; } else { d += n; s += n; while (n--) *--d = *--s; }
  return dst;
}
"""


def missing_tools() -> List[str]:
    """The emulation tools not found on PATH (empty when everything is there).

    Examples
    --------
    >>> isinstance(missing_tools(), list)
    True
    """
    found = hexagon_emulator()
    return [tool for tool in TOOLS if tool not in found]


def _include_dirs() -> List[str]:
    root = os.path.dirname(tvm.__file__)
    return [os.path.join(root, "include"), os.path.join(root, "3rdparty", "dlpack", "include")]


def kernel_source(sched: te.Schedule, args: Sequence[te.Tensor], name: str = "tcu_kernel") -> str:
    """C source of a schedule whose tiles call the HVX helpers (TVM's C backend, asserts off).

    Examples
    --------
    >>> from tvm import te
    >>> a = te.placeholder((4,), "int32"); b = te.compute((4,), lambda i: a[i] + 1)
    >>> "int32_t k(" in kernel_source(te.create_schedule(b.op), [a, b], "k")
    True
    """
    with tvm.transform.PassContext(config={"tir.disable_assert": True}):
        lib = tvm.build(sched, list(args), target="c", name=name)
    # Freestanding: no libc headers (the integer kernels need nothing from math.h).
    return lib.get_source().replace("#include <math.h>", "")


def _c_array(name: str, values) -> str:
    return f"static int64_t {name}[] = {{{', '.join(str(int(v)) for v in values) or '0'}}};"


def harness_source(arrays: Sequence[np.ndarray], name: str = "tcu_kernel", arena: int = 64 << 20) -> str:
    """A freestanding ``_start`` that reads ``arrays[:-1]`` sizes of input from stdin,
    calls ``name`` on them and the output buffer, and writes the output to stdout.

    Examples
    --------
    >>> src = harness_source([np.zeros(4, "uint8"), np.zeros(2, "int32")])
    >>> "_start" in src and "tcu_kernel(" in src
    True
    """
    lines = [
        "#include <stdint.h>",
        '#include "tvm/runtime/c_runtime_api.h"',
        '#include "tvm/runtime/c_backend_api.h"',
        f"#define TCU_ARENA {arena}",
        helpers_source(),
        _RUNTIME,
        f"int32_t {name}(void*, int32_t*, int32_t, void*, int32_t*, void*);",
    ]
    for i, arr in enumerate(arrays):
        lines.append(f"static unsigned char buf{i}[{max(arr.nbytes, 1)}] __attribute__((aligned(128)));")
        lines.append(_c_array(f"shape{i}", arr.shape))
    lines.append("void _start(void) {")
    lines.append(f"  DLTensor t[{len(arrays)}]; TVMValue v[{len(arrays)}]; int32_t codes[{len(arrays)}];")
    for i, arr in enumerate(arrays[:-1]):
        lines.append(f"  if (tcu_io(63, 0, buf{i}, {arr.nbytes})) tcu_exit(3);")
    for i, arr in enumerate(arrays):
        dt = np.dtype(arr.dtype)
        code = _DL_CODES[dt.kind.replace("i", "int").replace("u", "uint").replace("f", "float")]
        lines += [
            f"  t[{i}].data = buf{i}; t[{i}].device.device_type = kDLCPU; t[{i}].device.device_id = 0;",
            f"  t[{i}].ndim = {arr.ndim}; t[{i}].dtype.code = {code}; t[{i}].dtype.bits = {dt.itemsize * 8};",
            f"  t[{i}].dtype.lanes = 1; t[{i}].shape = shape{i}; t[{i}].strides = 0; t[{i}].byte_offset = 0;",
            f"  v[{i}].v_handle = &t[{i}]; codes[{i}] = kTVMDLTensorHandle;",
        ]
    out = arrays[-1]
    lines += [
        "  TVMValue ret; int32_t ret_code;",
        f"  if ({name}(v, codes, {len(arrays)}, &ret, &ret_code, 0) != 0) tcu_exit(4);",
        f"  if (tcu_io(64, 1, buf{len(arrays) - 1}, {out.nbytes})) tcu_exit(5);",
        "  tcu_exit(0);",
        "}",
    ]
    return "\n".join(lines) + "\n"


def run(sched: te.Schedule, args: Sequence[te.Tensor], inputs: Sequence[np.ndarray], timeout: int = 600) -> np.ndarray:
    """Compile ``sched`` for Hexagon with clang-16 and run it under qemu-hexagon.

    Parameters
    ----------
    sched : te.Schedule
        Built with ``mode="extern"`` under a Hexagon target (tiles call the HVX helpers).
    args : sequence of te.Tensor
        The function's arguments: the inputs, then the single output.
    inputs : sequence of numpy.ndarray
        Values of the input arguments (shapes and dtypes must match).

    Returns
    -------
    numpy.ndarray
        The output computed on the emulated Hexagon.

    Raises
    ------
    RuntimeError
        When a tool is missing, compilation fails, or the program exits non-zero.

    Examples
    --------
    Skipped by the doctest run because it needs the emulation tools (``qemu-user``,
    ``clang-16``, ``lld-16``); ``python_tests/dotprod/test_hexagon.py`` runs the
    package's vrmpy schedules this way wherever they are installed.

    >>> from tvm import te
    >>> a = te.placeholder((4,), "int32", name="a")
    >>> b = te.compute((4,), lambda i: a[i] + 1, name="b")
    >>> run(te.create_schedule(b.op), [a, b], [np.arange(4, dtype="int32")])  # doctest: +SKIP
    array([1, 2, 3, 4], dtype=int32)
    """
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"Hexagon emulation needs {', '.join(missing)} (apt-get install qemu-user clang-16 lld-16)")
    if len(inputs) != len(args) - 1:
        raise ValueError(f"expected {len(args) - 1} input arrays for {len(args)} arguments, got {len(inputs)}")
    inputs = [np.ascontiguousarray(x) for x in inputs]
    for tensor, value in zip(args, inputs):
        want = (tuple(int(d) for d in tensor.shape), str(tensor.dtype))
        if (value.shape, str(value.dtype)) != want:
            raise ValueError(f"input for {tensor.name} must have shape/dtype {want}, got {value.shape}/{value.dtype}")
    out_t = args[-1]
    out = np.zeros([int(d) for d in out_t.shape], str(out_t.dtype))
    tools = hexagon_emulator()
    flags = ["--target=hexagon-unknown-linux-musl", f"-mcpu={CPU}", "-mhvx", "-mhvx-length=128b", "-O2",
             "-ffreestanding", "-fno-builtin", "-w"] + [f"-I{d}" for d in _include_dirs()]
    with tempfile.TemporaryDirectory(prefix="tcu_hexagon_") as tmp:
        files = {"kernel.c": kernel_source(sched, args), "harness.c": harness_source([*inputs, out])}
        objects = []
        for fname, text in files.items():
            with open(os.path.join(tmp, fname), "w") as f:
                f.write(text)
            obj = os.path.join(tmp, fname[:-2] + ".o")
            _check([tools["clang"], *flags, "-c", os.path.join(tmp, fname), "-o", obj], "clang")
            objects.append(obj)
        binary = os.path.join(tmp, "kernel")
        _check([tools["lld"], "-static", "-e", "_start", *objects, "-o", binary], "ld.lld")
        payload = b"".join(x.tobytes() for x in inputs)
        proc = subprocess.run([tools["qemu"], binary], input=payload, capture_output=True,
                              timeout=timeout)
        if proc.returncode != 0 or len(proc.stdout) != out.nbytes:
            raise RuntimeError(
                f"qemu-hexagon run failed (exit {proc.returncode}, {len(proc.stdout)} of {out.nbytes} bytes): "
                f"{proc.stderr.decode(errors='replace')[-500:]}"
            )
    return np.frombuffer(proc.stdout, dtype=out.dtype).reshape(out.shape).copy()


def _check(cmd: List[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr[-2000:]}")

