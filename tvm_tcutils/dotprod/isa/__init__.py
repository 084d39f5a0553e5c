"""Dot-product instruction descriptions (lanes, operand types, LLVM intrinsics).

:data:`ISAS` lists them in order of preference; :func:`for_target` picks the
first one a target supports. :data:`RANGE_ISAS` are faster steps that are exact
only for kernel values in a range: :func:`for_layer` picks one of them for a
constant kernel that fits it, else the target's ISA.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional, Tuple

import numpy as np

from .base import DotProductISA, DotVariant
from .hexagon_hvx import HEXAGON_HVX
from .x86_avx2 import X86_AVX2
from .x86_avx2_u8s7 import X86_AVX2_U8S7
from .x86_sse import X86_SSE
from .x86_amx import X86_AMX, TileISA
from .x86_vnni import X86_VNNI

#: Every ISA, best first (a CPU with VNNI also has AVX2).
ISAS: Tuple[DotProductISA, ...] = (HEXAGON_HVX, X86_VNNI, X86_AVX2, X86_SSE)

#: Per-layer choices, best first: each is taken for a constant kernel its ``kernel_range`` holds
#: (:meth:`DotProductISA.fits`) on the targets it supports.
RANGE_ISAS: Tuple[DotProductISA, ...] = (X86_AVX2_U8S7,)


#: Tile engines, best first: each kernel family that has a tile form asks :func:`tile_isa` first and
#: keeps its 4-way dot-product kernel (:func:`for_target`) for what the tiles do not take.
TILE_ISAS: Tuple[TileISA, ...] = (X86_AMX,)


def tile_isa(target) -> Optional[TileISA]:
    """The tile engine of ``target`` (a Target or string) that this process may build for, or None.

    Examples
    --------
    >>> tile_isa("llvm -mcpu=sapphirerapids -mattr=-amx-int8") is None
    True
    >>> tile_isa("llvm -mcpu=znver4") is None
    True
    """
    if target is None:
        return None
    target = _as_target(target)
    return next((isa for isa in TILE_ISAS if isa.supports(target)), None)


#: False inside :func:`exact_only`.
_RANGE_ALLOWED: contextvars.ContextVar = contextvars.ContextVar("tcutils_range_isas", default=True)


@contextlib.contextmanager
def exact_only() -> Iterator[None]:
    """Within it, :func:`for_layer` picks no :data:`RANGE_ISAS` entry: every layer built keeps its
    target's exact step (to compare the two, or to rule the saturating instruction out).

    Examples
    --------
    >>> w = np.zeros((8, 4), "int8")
    >>> with exact_only():
    ...     inside = for_layer("llvm -mcpu=core-avx2", w).name
    >>> inside, for_layer("llvm -mcpu=core-avx2", w).name
    ('x86_avx2', 'x86_avx2_u8s7')
    """
    token = _RANGE_ALLOWED.set(False)
    try:
        yield
    finally:
        _RANGE_ALLOWED.reset(token)


def _as_target(target):
    from ..._tvm import tvm

    return tvm.target.Target(target) if isinstance(target, str) else target


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
    if target is None:
        return None
    target = _as_target(target)
    for isa in ISAS:
        if isa.supports(target):
            return isa
    return None


def range_isa(target) -> Optional[DotProductISA]:
    """The first of :data:`RANGE_ISAS` that ``target`` supports, or None.

    Examples
    --------
    >>> range_isa("llvm -mcpu=core-avx2").name
    'x86_avx2_u8s7'
    >>> range_isa("llvm -mcpu=znver4") is None  # VNNI is exact and faster
    True
    """
    if target is None:
        return None
    target = _as_target(target)
    return next((isa for isa in RANGE_ISAS if isa.supports(target)), None)


def for_layer(target, kernel: Optional[np.ndarray]) -> Optional[DotProductISA]:
    """The ISA for one layer: a :data:`RANGE_ISAS` entry whose range holds every value of the
    constant ``kernel`` (None: not a constant), else :func:`for_target`'s.

    Examples
    --------
    >>> for_layer("llvm -mcpu=core-avx2", np.full((8, 8), 64, "int8")).name
    'x86_avx2_u8s7'
    >>> for_layer("llvm -mcpu=core-avx2", np.full((8, 8), 65, "int8")).name
    'x86_avx2'
    >>> for_layer("llvm -mcpu=core-avx2", None).name
    'x86_avx2'
    """
    narrow = range_isa(target) if _RANGE_ALLOWED.get() else None
    if narrow is not None and kernel is not None and kernel.dtype == np.int8 and narrow.fits(kernel):
        return narrow
    return for_target(target)


def by_name(name: str) -> DotProductISA:
    """The ISA called ``name``.

    Examples
    --------
    >>> by_name("hexagon_hvx").lanes
    32
    """
    for isa in ISAS + RANGE_ISAS:
        if isa.name == name:
            return isa
    raise ValueError(f"unknown dot-product ISA {name!r}; choose one of {[i.name for i in ISAS + RANGE_ISAS]}")


__all__ = [
    "DotProductISA", "DotVariant", "ISAS", "RANGE_ISAS", "HEXAGON_HVX", "X86_VNNI", "X86_AVX2",
    "X86_AVX2_U8S7", "X86_SSE", "X86_AMX", "TileISA", "TILE_ISAS", "tile_isa", "for_target", "for_layer",
    "range_isa", "exact_only", "by_name",
]
