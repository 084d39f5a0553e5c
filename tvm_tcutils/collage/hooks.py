"""Registration of the Collage toolchains ``tcutils_ort`` and ``tcutils_blas``.

Each toolchain contributes its external codegen (``relay.ext.<compiler>``),
the packed functions its compiled modules call, and its BYOC pattern table;
the computations live in :mod:`tvm_tcutils.collage.toolchains`.
"""
from __future__ import annotations

from typing import List

from .. import registry
from .toolchains import blas, ort


def hooks() -> List[registry.Hook]:
    """Hooks of both toolchains (ONNX Runtime's pattern table only when it is installed).

    Examples
    --------
    >>> names = [hook.name for hook in hooks()]
    >>> "relay.ext.tcutils_blas" in names and "tcutils_blas" in names
    True
    """
    return ort.hooks() + blas.hooks()
