"""Optional native helpers (built from ``cmake/``), loaded when present.

The library registers packed functions into TVM's global registry; Python code
calls them through ``tvm.get_global_func`` and keeps a pure-Python path for
installs where the library was not built (no compiler).
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

from ._tvm import tvm

#: ABI version this Python code expects (see cmake/src/info.cc).
ABI_VERSION = 2
_LIB_NAME = "libtvm_tcutils_native.so"
_loaded: Optional[ctypes.CDLL] = None


def library_path() -> Optional[str]:
    """Where the native library is, or ``None`` when it was not built.

    ``TVM_TCUTILS_NATIVE`` names it explicitly; otherwise the package directory
    and the source tree's ``cmake/build`` are searched.

    Examples
    --------
    >>> library_path() is None or library_path().endswith(".so")
    True
    """
    explicit = os.environ.get("TVM_TCUTILS_NATIVE")
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, _LIB_NAME), os.path.join(os.path.dirname(here), "cmake", "build", _LIB_NAME)):
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
