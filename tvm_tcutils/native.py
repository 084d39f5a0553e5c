"""The native plugins (built from ``cmake/``), loaded when present: the one place that loads them.

Two libraries, each optional: the helpers (``libtvm_tcutils_native.so``: packed
functions the package calls through ``tvm.get_global_func``, with a pure-Python
path where it was not built) and the CUDA plugin (``libtvm_tcutils_cuda.so``:
TVM's own CUDA code generator entry, runtime module and device API for a TVM
built without CUDA; see :mod:`tvm_tcutils.cuda`). Both register into the
running TVM from their static initializers.
"""
from __future__ import annotations

import ctypes
import os
from typing import Dict, List, Optional, Tuple

from ._tvm import tvm

#: ABI version this Python code expects (see cmake/src/info.cc).
ABI_VERSION = 2
#: ABI version of the CUDA plugin this Python code expects (see cmake/cuda/compile.cc).
CUDA_ABI_VERSION = 1
_LIB_NAME = "libtvm_tcutils_native.so"
#: The CUDA plugin and the variable that names it explicitly.
CUDA_LIB_NAME = "libtvm_tcutils_cuda.so"
_loaded: Optional[ctypes.CDLL] = None
_cuda: Dict[str, object] = {}


def library_path(name: str = _LIB_NAME, variable: str = "TVM_TCUTILS_NATIVE") -> Optional[str]:
    """Where a native library is, or ``None`` when it was not built.

    The environment variable ``variable`` names it explicitly (``TVM_TCUTILS_NATIVE``
    for the helpers, ``TVM_TCUTILS_CUDA_PLUGIN`` for the CUDA plugin); otherwise the
    package directory and the source tree's ``cmake/build`` are searched.

    Examples
    --------
    >>> library_path() is None or library_path().endswith(".so")
    True
    """
    explicit = os.environ.get(variable)
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, name), os.path.join(os.path.dirname(here), "cmake", "build", name)):
        if os.path.isfile(candidate):
            return candidate
    return None


def load() -> bool:
    """Load the native library if it exists and matches; returns whether it is usable.

    Examples
    --------
    >>> isinstance(load(), bool)
    True
    """
    global _loaded
    if _loaded is not None:
        return True
    path = library_path()
    if path is None:
        return False
    # RTLD_GLOBAL: its static initializers register into the libtvm.so that
    # Python's tvm already loaded.
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    version = tvm.get_global_func("tvm_tcutils.native.abi_version", allow_missing=True)
    if version is None or int(version()) != ABI_VERSION:
        return False
    _loaded = lib
    return True


def get(name: str):
    """A packed function of the native library, or ``None`` when not available.

    Examples
    --------
    >>> get("tvm_tcutils.native.abi_version") is None or get("tvm_tcutils.native.abi_version")() == ABI_VERSION
    True
    """
    if not load():
        return None
    return tvm.get_global_func(name, allow_missing=True)


def load_cuda(runtime_libraries: List[str]) -> Tuple[bool, str]:
    """Load the CUDA plugin once; returns whether it is usable and, if not, why.

    ``runtime_libraries`` are the toolkit's shared libraries the plugin needs
    (NVRTC and its builtins), loaded first by path: the PyPI toolkit's folder is
    on no loader path. The CUDA driver is not among them: the plugin opens it on
    first use, so loading works on machines without a GPU.

    Examples
    --------
    >>> ok, why = load_cuda([])
    >>> ok or bool(why)
    True
    """
    if "result" in _cuda:
        return _cuda["result"]  # type: ignore[return-value]
    path = library_path(CUDA_LIB_NAME, "TVM_TCUTILS_CUDA_PLUGIN")
    if path is None:
        result = (False, "the CUDA plugin is not built (scripts/build_native.sh builds it where a CUDA "
                         "toolkit and the TVM source are found; see docs/cuda.md)")
    elif tvm.get_global_func("target.build.cuda", allow_missing=True) is not None \
            and tvm.get_global_func("tvm_tcutils.cuda.abi_version", allow_missing=True) is None:
        # A TVM built with CUDA: its own code generator stays; loading ours would register it twice.
        result = (False, "TVM has its own CUDA code generator; the plugin is not needed")
    else:
        try:
            for library in runtime_libraries:
                ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
            _cuda["lib"] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            result = (False, f"the CUDA plugin {path} does not load: {err}")
        else:
            version = tvm.get_global_func("tvm_tcutils.cuda.abi_version", allow_missing=True)
            if version is None or int(version()) != CUDA_ABI_VERSION:
                result = (False, f"the CUDA plugin {path} is from another version of the package (rebuild it: "
                                 "scripts/build_native.sh)")
            else:
                result = (True, "")
    _cuda["result"] = result
    return result
