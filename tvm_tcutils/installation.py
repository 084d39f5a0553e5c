"""What this installation can do: the TVM found, its code generators, devices and optional parts.

One flat report for ``tvm-tcutils info``, the tests' skips and the benchmark
headers. It reads :mod:`tvm_tcutils._tvm` (TVM's features),
:mod:`tvm_tcutils.native` (the optional helpers) and :mod:`tvm_tcutils.cuda`
(the CUDA plugin, toolkit and driver); it lives apart from them
because ``native`` needs ``_tvm`` to load, and a report inside ``_tvm`` would
make the two import each other.
"""
from __future__ import annotations

import os
from typing import Dict, Optional

from . import cuda, native
from ._tvm import (
    TESTED_TVM_VERSIONS,
    has_codegen,
    has_device,
    has_module,
    hexagon_emulator,
    host_target,
    llvm_targets,
    llvm_version,
    tvm,
)

#: The tools :func:`tvm_tcutils._tvm.hexagon_emulator` must find for Hexagon code to run here.
HEXAGON_TOOLS = ["clang", "lld", "qemu"]


def capabilities() -> Dict[str, object]:
    """What this TVM and machine can do, as one flat dictionary.

    Examples
    --------
    >>> caps = capabilities()
    >>> caps["relay"] and caps["autotvm"]
    True
    >>> caps["tvm_version"] == tvm.__version__
    True
    >>> caps["cuda_codegen"] or bool(caps["cuda_reason"])  # no CUDA code generation says why
    True
    """
    version = None
    if has_module("onnxruntime"):
        import onnxruntime

        version = onnxruntime.__version__
    return {
        "tvm_version": tvm.__version__,
        "tvm_path": os.path.dirname(tvm.__file__),
        "tvm_tested": tvm.__version__ in TESTED_TVM_VERSIONS,
        "relay": has_module("tvm.relay"),
        "autotvm": has_module("tvm.autotvm"),
        "llvm_version": llvm_version(),
        "llvm_targets": llvm_targets(),
        "host_target": host_target(),
        **_cuda(),
        "hexagon_codegen": has_codegen("hexagon"),
        "hexagon_emulator": sorted(hexagon_emulator()) == HEXAGON_TOOLS,
        "onnxruntime": version,
        "native_helpers": native.library_path() if native.load() else None,
    }


def _cuda() -> Dict[str, object]:
    """The ``cuda_*`` entries of :func:`capabilities`, from :func:`tvm_tcutils.cuda.status`.

    ``cuda_codegen`` (TVM can generate CUDA code: its own generator or the package's
    plugin) and ``cuda_device`` (a GPU TVM can use) mean what they always meant;
    the others say where the code generation comes from and why something is missing.
    """
    state = cuda.status()  # loads the plugin first, so that target.build.cuda is there when it can be
    device = has_device("cuda")
    arch: Optional[str] = None
    if device:
        arch = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    plugin = native.library_path(native.CUDA_LIB_NAME, "TVM_TCUTILS_CUDA_PLUGIN") if state["plugin"] else None
    try:
        compiler: Optional[str] = cuda.compiler()
    except ValueError:  # a bad TVM_TCUTILS_CUDA_COMPILER: compile_cuda says so when used; the report goes on
        compiler = None
    return {
        "cuda_codegen": has_codegen("cuda"),
        "cuda_device": device,
        # Why there is no CUDA code generation ("" when there is).
        "cuda_reason": str(state["reason"]),
        # The package's plugin that provides it (None: not loaded, or TVM's own generator).
        "cuda_plugin": plugin,
        "cuda_toolkit": state["toolkit"],
        "cuda_nvrtc": state["nvrtc"],
        # TVM_TCUTILS_CUDA_COMPILER's choice (None when the variable names no compiler).
        "cuda_compiler": compiler,
        # Why the driver does not load ("" when it does).
        "cuda_driver": str(state["driver"]),
        # GPU 0's architecture, when there is one.
        "cuda_arch": arch,
    }
