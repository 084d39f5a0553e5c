"""What this installation can do: the TVM found, its code generators, devices and optional parts.

One flat report for ``tvm-tcutils info``, the tests' skips and the benchmark
headers. It reads :mod:`tvm_tcutils._tvm` (TVM's features) and
:mod:`tvm_tcutils.native` (the optional helpers); it lives apart from both
because ``native`` needs ``_tvm`` to load, and a report inside ``_tvm`` would
make the two import each other.
"""
from __future__ import annotations

import os
from typing import Dict

from . import native
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
        "cuda_codegen": has_codegen("cuda"),
        "cuda_device": has_device("cuda"),
        "hexagon_codegen": has_codegen("hexagon"),
        "hexagon_emulator": sorted(hexagon_emulator()) == HEXAGON_TOOLS,
        "onnxruntime": version,
        "native_helpers": native.library_path() if native.load() else None,
    }
