"""CUDA for a TVM built without it: the toolkit, the plugin, the compiler callback and the machine code.

The TVM wheel the package runs on has no CUDA code generator. The CUDA plugin
(``cmake/cuda``, built by ``scripts/build_native.sh``; loaded by
:func:`tvm_tcutils.native.load_cuda`) adds TVM's own ``target.build.cuda``, the
CUDA runtime module (saved and loaded by ``export_library``) and the
``device_api.cuda`` device API. The CUDA toolkit comes from PyPI (the ``cuda``
extra: ``nvidia-cuda-nvcc``, ``-runtime``, ``-nvrtc``, ... install one tree,
``nvidia/cu13``) or from ``CUDA_PATH``.

Kernels are compiled by :func:`compile_cuda`, which the package installs as
TVM's ``tvm_callback_cuda_compile`` while the plugin is loaded: NVRTC by
default, ``nvcc`` with ``TVM_TCUTILS_CUDA_COMPILER=nvcc``, in both cases for
the target's ``-arch`` and to a cubin, so that a machine without a GPU makes
the same machine code as one with it. :func:`sass` and :func:`resources` read
that machine code back (``cuobjdump``).

Examples
--------
>>> info = status()
>>> sorted(info)[:3]
['codegen', 'device', 'driver']
>>> info["codegen"] or bool(info["reason"])
True
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import subprocess
import tempfile
from typing import Dict, List, Optional, Tuple, Union

from . import native
from ._tvm import tvm

#: The CUDA C++ compilers :func:`compile_cuda` can use (``TVM_TCUTILS_CUDA_COMPILER``).
COMPILERS = ("nvrtc", "nvcc")
#: The oldest architecture CUDA 13 compiles for (sm_75: NVRTC and nvcc reject older ones).
MIN_ARCH = 75
#: Architectures with integer tensor-core (IMMA) instructions that CUDA 13 still compiles for.
TENSORCORE_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")


def toolkit_root() -> Optional[str]:
    """The CUDA toolkit's folder (``include/cuda.h``, ``bin/``, ``lib/``), or ``None``.

    ``CUDA_PATH`` first, then the PyPI wheels' tree (``site-packages/nvidia/cu13``),
    then ``/usr/local/cuda``.

    Examples
    --------
    >>> root = toolkit_root()
    >>> root is None or os.path.isfile(os.path.join(root, "include", "cuda.h"))
    True
    """
    candidates: List[str] = []
    if os.environ.get("CUDA_PATH"):
        candidates.append(os.environ["CUDA_PATH"])
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidates.extend(sorted(glob.glob(os.path.join(folder, "cu1[0-9]")), reverse=True))
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if os.path.isfile(os.path.join(root, "include", "cuda.h")):
            return os.path.abspath(root)
    return None


def tool(name: str) -> Optional[str]:
    """The path of the toolkit's program ``name`` (``nvcc``, ``cuobjdump``, ...), or ``None``.

    Examples
    --------
    >>> path = tool("cuobjdump")
    >>> path is None or os.access(path, os.X_OK)
    True
    """
    root = toolkit_root()
    path = os.path.join(root, "bin", name) if root else None
    return path if path and os.access(path, os.X_OK) else None


def _runtime_libraries(root: Optional[str]) -> List[str]:
    """NVRTC and its builtins (opened by name by NVRTC itself), from the toolkit's library folder."""
    if root is None:
        return []
    found: List[str] = []
    for pattern in ("libnvrtc.so.*", "libnvrtc-builtins.so.*"):
        for lib_dir in ("lib", "lib64"):
            matches = [p for p in sorted(glob.glob(os.path.join(root, lib_dir, pattern))) if ".alt." not in p]
            if matches:
                found.append(matches[0])
                break
    return found


def load() -> bool:
    """Load the CUDA plugin (once); whether TVM can now generate CUDA code.

    Examples
    --------
    >>> load() == status()["codegen"]
    True
    """
    if native.load_cuda(_runtime_libraries(toolkit_root()))[0]:
        return True
    # A TVM built with CUDA needs no plugin.
    return tvm.get_global_func("target.build.cuda", allow_missing=True) is not None


def plugin_loaded() -> bool:
    """Whether the package's CUDA plugin (not a CUDA build of TVM) provides CUDA code generation.

    Examples
    --------
    >>> plugin_loaded() in (True, False)
    True
    """
    load()
    return tvm.get_global_func("tvm_tcutils.cuda.abi_version", allow_missing=True) is not None


def status() -> Dict[str, object]:
    """What CUDA can do here, and why not: for ``tvm-tcutils info`` and the tests' skips.

    Keys: ``codegen`` (``target.build.cuda`` exists), ``reason`` (why not, else ``""``),
    ``plugin`` (the package's plugin provides it), ``toolkit`` (its folder),
    ``nvrtc`` (version), ``driver`` (``""`` or why the driver does not load),
    ``device`` (a GPU TVM can use).

    Examples
    --------
    >>> isinstance(status()["device"], bool)
    True
    """
    root = toolkit_root()
    ok, why = native.load_cuda(_runtime_libraries(root))
    codegen = ok or tvm.get_global_func("target.build.cuda", allow_missing=True) is not None
    if not codegen and root is None:
        why = "no CUDA toolkit found (pip install 'tvm-tcutils[cuda]', or set CUDA_PATH); " + why
    driver_error = tvm.get_global_func("tvm_tcutils.cuda.driver_error", allow_missing=True)
    nvrtc = tvm.get_global_func("tvm_tcutils.cuda.nvrtc_version", allow_missing=True)
    driver = driver_error() if driver_error else ("" if codegen else "no CUDA runtime")
    device = False
    if codegen and not driver:
        try:
            device = bool(tvm.cuda(0).exist)
        except tvm.TVMError:
            device = False
    return {
        "codegen": codegen,
        "reason": "" if codegen else why,
        "plugin": ok,
        "toolkit": root,
        "nvrtc": str(nvrtc()) if nvrtc else None,
        "driver": str(driver),
        "device": device,
    }


def compiler() -> str:
    """The CUDA C++ compiler :func:`compile_cuda` uses: ``TVM_TCUTILS_CUDA_COMPILER``, default ``nvrtc``.

    Examples
    --------
    >>> compiler() in COMPILERS
    True
    """
    chosen = os.environ.get("TVM_TCUTILS_CUDA_COMPILER", "nvrtc").strip().lower()
    if chosen not in COMPILERS:
        raise ValueError(f"TVM_TCUTILS_CUDA_COMPILER={chosen!r} is not a CUDA compiler; valid: {', '.join(COMPILERS)}")
    return chosen


def target_arch(target: Union[str, "tvm.target.Target", None]) -> str:
    """The ``sm_XX`` a CUDA target compiles for: its ``-arch``, else GPU 0's.

    Raises
    ------
    ValueError
        When the target names no ``-arch`` and there is no GPU to ask, or the
        arch is older than :data:`MIN_ARCH` (sm_75), the oldest CUDA 13 compiles
        for -- ``sm_50`` in particular, which TVM writes into a ``cuda`` target
        given without ``-arch`` on a machine without a GPU.

    Examples
    --------
    >>> target_arch("cuda -arch=sm_80")
    'sm_80'
    >>> target_arch("cuda -arch=sm_50")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: target 'cuda -arch=sm_50' compiles for sm_50, older than sm_75, the oldest CUDA 13 compiles for ...
    """
    name = None
    if target is not None:
        name = target if isinstance(target, str) else str(target)
        target = tvm.target.Target(target) if isinstance(target, str) else target
        arch = target.attrs.get("arch")
        if arch:
            match = re.fullmatch(r"sm_(\d+)[a-z]?", str(arch))
            if match is None:
                raise ValueError(f"target -arch={arch!r} is not an architecture like sm_80")
            return _check_arch(str(arch), int(match.group(1)), f"target {name!r}")
    if status()["device"]:
        version = str(tvm.cuda(0).compute_version).replace(".", "")
        return _check_arch("sm_" + version, int(version), "GPU 0")
    raise ValueError("the CUDA target names no -arch and there is no GPU to ask; "
                     f"give one, e.g. 'cuda -arch=sm_80' (tensor cores: {', '.join(TENSORCORE_ARCHS)})")


def _check_arch(arch: str, number: int, what: str) -> str:
    if number >= MIN_ARCH:
        return arch
    default = (" (sm_50 is what TVM puts in a 'cuda' target given without -arch when it finds no GPU)"
               if number == 50 else "")
    raise ValueError(f"{what} compiles for {arch}, older than sm_{MIN_ARCH}, the oldest CUDA 13 compiles for"
                     f"{default}: name the GPU's architecture, e.g. 'cuda -arch=sm_80'")


# TVM 0.19's CUDA code generator prints a broadcast of an 8-bit value to 8 or 16 lanes (the zero fill
# of a padded, vectorized int8/uint8 load) as make_int2/make_int4 (make_uint2/make_uint4) with one
# argument per byte: it does not compile. Each such call becomes the same vector with every 32-bit word
# holding four copies of the byte. The byte's cast is TVM's spelling of the 8-bit scalar type:
# "(signed char)" for int8, "(uchar)" for uint8 (codegen_cuda.cc PrintType: "u" + "char"); "(char)" and
# "(unsigned char)" are accepted too.
_BYTE_CAST = r"\((?:signed char|unsigned char|uchar|char)\)"
_BYTE_ARG = rf"(?:{_BYTE_CAST}[^,()]+|{_BYTE_CAST}\([^()]*\))"
_BYTE_BROADCAST = re.compile(rf"make_(u?int)([24])\(({_BYTE_ARG}(?:, {_BYTE_ARG})*)\)")
_GNU_ASM = re.compile(r"\b__asm__\s+__volatile__\s*\(")


def repair_source(code: str) -> str:
    """TVM's generated CUDA with its 8-bit vector broadcasts and inline assembly written so that NVRTC accepts them.

    TVM 0.19 prints ``int8x16`` zero fills as ``make_int4`` with sixteen
    ``(signed char)0`` arguments, ``uint8x16`` ones as ``make_uint4`` with sixteen
    ``(uchar)0`` ("too many arguments in function call"). The package installs
    this as TVM's ``tvm_callback_cuda_postproc``: each such call becomes
    ``make_int4(w, w, w, w)`` (``make_uint4``) with ``w`` the byte repeated in a
    32-bit word. Everything else is left as it is.

    Examples
    --------
    >>> repair_source("x = make_int4(" + ", ".join(["(signed char)0"] * 16) + ");")
    'x = make_int4((int)(0x00000000), (int)(0x00000000), (int)(0x00000000), (int)(0x00000000));'
    >>> repair_source("u = make_uint4(" + ", ".join(["(uchar)0"] * 16) + ");")
    'u = make_uint4(0x00000000, 0x00000000, 0x00000000, 0x00000000);'
    >>> repair_source("v = make_uint2(" + ", ".join(["(uchar)200"] * 8) + ");")
    'v = make_uint2(0xc8c8c8c8, 0xc8c8c8c8);'
    >>> repair_source("y = make_int4(a, b, c, d);")
    'y = make_int4(a, b, c, d);'
    >>> repair_source('__asm__ __volatile__("cp.async.commit_group;");')
    'asm volatile("cp.async.commit_group;");'
    """

    def _word(match: "re.Match[str]") -> str:
        kind, words = match.group(1), int(match.group(2))
        args = [a.strip() for a in match.group(3).split(", ")]
        if len(args) != 4 * words or len(set(args)) != 1:
            return match.group(0)  # a real per-lane constructor, or one TVM prints correctly
        value = re.sub("^" + _BYTE_CAST, "", args[0]).strip()
        if re.fullmatch(r"-?\d+", value):
            word = f"0x{(int(value) & 0xFF) * 0x01010101:08x}"
        else:
            word = f"0x01010101u * (unsigned char)({value})"
        word = f"({kind})({word})" if kind == "int" else word
        return f"make_{kind}{words}(" + ", ".join([word] * words) + ")"

    # NVRTC knows inline assembly only as ``asm``: TVM's cp.async and barrier helpers print the GNU
    # spelling ``__asm__ __volatile__`` ("identifier __asm__ is undefined"); nvcc takes both.
    return _GNU_ASM.sub("asm volatile(", _BYTE_BROADCAST.sub(_word, code))


def prepend_helpers(code: str, helpers: str, called: Tuple[str, ...]) -> str:
    r"""``code`` with the device functions ``helpers`` in front when it calls one of ``called`` (names or name
    prefixes) and does not have them yet (``helpers``' first non-empty line marks them): how the package's
    CUDA post-processing adds the helpers its kernels call as externs.

    Examples
    --------
    >>> helpers = "// demo helpers\n__device__ int demo_one() { return 1; }\n"
    >>> code = prepend_helpers("x = demo_one();", helpers, ("demo_",))
    >>> code.startswith("// demo helpers") and prepend_helpers(code, helpers, ("demo_",)) == code
    True
    >>> prepend_helpers("x = 1;", helpers, ("demo_",))
    'x = 1;'
    """
    mark = next(line for line in helpers.splitlines() if line.strip())
    if mark in code or not any(name in code for name in called):
        return code
    return helpers + code


def compile_cuda(code: str, target: Union[str, "tvm.target.Target", None] = None) -> bytearray:
    """CUDA C++ to a cubin for ``target``'s ``-arch``, with :func:`compiler`'s compiler.

    The package installs this as TVM's ``tvm_callback_cuda_compile`` while its
    plugin is loaded (TVM's own build calls it with each module's code).

    Raises
    ------
    ValueError
        For a target without an architecture (and no GPU), an unknown compiler.
    RuntimeError
        When the code does not compile (the compiler's messages included) or no
        compiler is installed.

    Examples
    --------
    >>> if plugin_loaded():
    ...     cubin = compile_cuda('extern "C" __global__ void k(int* x) { x[0] = 1; }', "cuda -arch=sm_80")
    ...     assert "k" in resources(cubin)
    """
    arch = target_arch(target)
    if arch == "sm_90" and "wgmma." in code:
        # Warp-group MMA exists only for the architecture-specific sm_90a; its cubin runs on every sm_90 GPU
        # (H100, H200), the only GPUs an sm_90 cubin runs on too.
        arch = "sm_90a"
    chosen = compiler()
    root = toolkit_root()
    if root is None:
        raise RuntimeError("no CUDA toolkit found to compile CUDA code: "
                           "pip install 'tvm-tcutils[cuda]' or set CUDA_PATH")
    if chosen == "nvrtc":
        nvrtc = tvm.get_global_func("tvm_tcutils.cuda.nvrtc_compile", allow_missing=True)
        if nvrtc is None:
            raise RuntimeError("NVRTC compilation needs the package's CUDA plugin (scripts/build_native.sh); "
                               "or set TVM_TCUTILS_CUDA_COMPILER=nvcc")
        try:
            return bytearray(nvrtc(code, arch, os.path.join(root, "include")))
        except tvm.TVMError as err:
            raise RuntimeError(str(err)) from None
    return nvcc_compile(code, arch, "cubin")


#: What :func:`nvcc_compile` can make: nvcc's ``--cubin`` or ``--ptx``.
NVCC_OUTPUTS = ("cubin", "ptx")


def nvcc_compile(code: str, arch: str, output: str = "cubin") -> bytearray:
    """CUDA C++ to a cubin (``arch`` an ``sm_XX``) or PTX (``arch`` may be a ``compute_XX``) with the toolkit's nvcc.

    PTX comes back as text starting with ``//``, which TVM's CUDA module loads through the driver's JIT
    (:func:`compile_cuda` uses the cubin form).

    Raises
    ------
    ValueError
        For an ``output`` not in :data:`NVCC_OUTPUTS`.
    RuntimeError
        When nvcc is missing or the code does not compile (its messages included).
    """
    if output not in NVCC_OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(NVCC_OUTPUTS)}, got {output!r}")
    root = toolkit_root()
    nvcc = tool("nvcc")
    if root is None or nvcc is None:
        raise RuntimeError(f"nvcc is not in the CUDA toolkit at {root} (pip install nvidia-cuda-nvcc)")
    with tempfile.TemporaryDirectory(prefix="tcutils-nvcc-") as tmp:
        source, result = os.path.join(tmp, "tvm_kernels.cu"), os.path.join(tmp, f"tvm_kernels.{output}")
        with open(source, "w", encoding="utf-8") as out:
            out.write(code)
        # nvcc finds ptxas, cicc and the host compiler's helpers through PATH and its own folder.
        env = {**os.environ, "PATH": os.path.join(root, "bin") + os.pathsep + os.environ.get("PATH", "")}
        proc = subprocess.run([nvcc, f"--{output}", "-O3", f"-arch={arch}", "-o", result, source],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc could not compile the kernels for {arch}:\n{proc.stdout}{proc.stderr}")
        with open(result, "rb") as handle:
            return bytearray(handle.read())


def module_cubin(module: "tvm.runtime.Module") -> bytes:
    """The cubin inside a built module (``tvm.build`` / ``relay.build``'s library, or the CUDA module itself).

    Raises
    ------
    ValueError
        When the module holds no CUDA module.

    Examples
    --------
    >>> if plugin_loaded():
    ...     x = tvm.te.placeholder((64,), "int32", name="x")
    ...     y = tvm.te.compute((64,), lambda i: x[i] + 1, name="y")
    ...     s = tvm.te.create_schedule(y.op)
    ...     s[y].bind(y.op.axis[0], tvm.te.thread_axis("threadIdx.x"))
    ...     lib = tvm.build(s, [x, y], tvm.target.Target("cuda -arch=sm_80", host="llvm"))
    ...     assert len(sass(module_cubin(lib))) == 1
    """
    lib = getattr(module, "lib", module)  # relay.build's factory module keeps the runtime module in .lib
    stack, found = [lib], None
    while stack and found is None:
        current = stack.pop()
        if current.type_key == "cuda":
            found = current
        stack.extend(current.imported_modules)
    if found is None:
        raise ValueError("module holds no CUDA module (was it built for a 'cuda' target?)")
    with tempfile.TemporaryDirectory(prefix="tcutils-cubin-") as tmp:
        path = os.path.join(tmp, "kernels.cubin")
        found.save(path, "cubin")
        with open(path, "rb") as handle:
            return handle.read()


def _cuobjdump(cubin: bytes, flag: str) -> str:
    program = tool("cuobjdump")
    if program is None:
        raise RuntimeError("cuobjdump is not installed: pip install 'tvm-tcutils[cuda]' (nvidia-cuda-cuobjdump)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        proc = subprocess.run([program, flag, handle.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump {flag} failed: {proc.stderr.strip()}")
    return proc.stdout


def sass(cubin: bytes) -> Dict[str, str]:
    """Each kernel's SASS (GPU machine code) in ``cubin``, by kernel name.

    Examples
    --------
    >>> if plugin_loaded() and tool("cuobjdump"):
    ...     code = sass(compile_cuda('extern "C" __global__ void k(int* x) { x[0] = 7; }', "cuda -arch=sm_80"))
    ...     assert "EXIT" in code["k"]
    """
    kernels: Dict[str, str] = {}
    name = None
    for line in _cuobjdump(cubin, "-sass").splitlines():
        match = re.match(r"\s*Function : (\S+)", line)
        if match:
            name = match.group(1)
            kernels[name] = ""
        elif name is not None:
            kernels[name] += line + "\n"
    return kernels


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one kernel uses per thread (registers, stack, local memory) and per block (shared memory)."""

    registers: int
    stack: int
    local: int
    shared: int


def resources(cubin: bytes) -> Dict[str, Resources]:
    """Per kernel: registers, stack, local and shared memory (``cuobjdump -res-usage``).

    Examples
    --------
    >>> if plugin_loaded() and tool("cuobjdump"):
    ...     use = resources(compile_cuda('extern "C" __global__ void k(int* x) { x[0] = 7; }', "cuda -arch=sm_80"))
    ...     assert use["k"].local == 0
    """
    found: Dict[str, Resources] = {}
    name = None
    for line in _cuobjdump(cubin, "-res-usage").splitlines():
        match = re.match(r"\s*Function (\S+?):?\s*$", line)
        if match:
            name = match.group(1)
            continue
        if name is not None and "REG:" in line:
            fields = dict(re.findall(r"(\w+):(\d+)", line))
            found[name] = Resources(int(fields.get("REG", 0)), int(fields.get("STACK", 0)),
                                    int(fields.get("LOCAL", 0)), int(fields.get("SHARED", 0)))
            name = None
    return found
