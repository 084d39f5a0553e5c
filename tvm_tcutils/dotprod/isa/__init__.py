"""Dot-product instruction descriptions (lanes, operand types, LLVM intrinsics).

:data:`ISAS` lists them in order of preference; :func:`for_target` picks the
first one a target supports.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .base import DotProductISA, DotVariant
from .hexagon_hvx import HEXAGON_HVX
from .x86_avx2 import X86_AVX2
from .x86_sse import X86_SSE
from .x86_vnni import X86_VNNI

#: Every ISA, best first (a CPU with VNNI also has AVX2).
ISAS: Tuple[DotProductISA, ...] = (HEXAGON_HVX, X86_VNNI, X86_AVX2, X86_SSE)


def for_target(target) -> Optional[DotProductISA]:
    """The preferred dot-product ISA of ``target`` (a Target or string), or None.

    Examples
    --------
    >>> for_target("llvm -mcpu=znver4").name
    'x86_vnni'
    >>> for_target("llvm -mcpu=core-avx2").name
    'x86_avx2'
    >>> for_target("llvm -mcpu=nehalem").name
    'x86_sse'
    >>> for_target("llvm") is None
    True
    """
    from ..._tvm import tvm

    if target is None:
        return None
    if isinstance(target, str):
        target = tvm.target.Target(target)
    for isa in ISAS:
        if isa.supports(target):
            return isa
    return None


def by_name(name: str) -> DotProductISA:
    """The ISA called ``name``.

    Examples
    --------
    >>> by_name("hexagon_hvx").lanes
    32
    """
    for isa in ISAS:
        if isa.name == name:
            return isa
    raise ValueError(f"unknown dot-product ISA {name!r}; choose one of {[i.name for i in ISAS]}")


__all__ = [
    "DotProductISA", "DotVariant", "ISAS", "HEXAGON_HVX", "X86_VNNI", "X86_AVX2", "X86_SSE", "for_target", "by_name",
]
