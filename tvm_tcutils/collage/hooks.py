"""Registration of the Collage toolchains ``tcutils_ort``, ``tcutils_openvino[_bf16]`` and ``tcutils_blas``.

Each toolchain contributes its external codegen (``relay.ext.<compiler>``),
the packed functions its compiled modules call, and its BYOC pattern table;
the computations live in :mod:`tvm_tcutils.collage.toolchains`.
"""
from __future__ import annotations

from typing import List

from .. import registry
from .toolchains import blas, openvino, ort


def hooks() -> List[registry.Hook]:
    """Hooks of the toolchains (ONNX Runtime's and OpenVINO's pattern tables only where installed).

    Examples
    --------
    >>> names = [hook.name for hook in hooks()]
    >>> "relay.ext.tcutils_blas" in names and "tcutils_blas" in names
    True
    """
    return ort.hooks() + openvino.hooks() + blas.hooks()
