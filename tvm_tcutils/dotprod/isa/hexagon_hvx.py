"""Hexagon HVX 128-byte mode: ``vrmpy`` (32 int32 lanes).

Three instructions cover the signedness pairs: ``vrmpybusv`` (u8 x i8, the
unsigned operand first), ``vrmpyubv`` (u8 x u8) and ``vrmpybv`` (i8 x i8). The
LLVM intrinsics take every HVX register as ``<32 x i32>``. The ``extern`` names
are the C helpers of :mod:`tvm_tcutils.dotprod.hexagon`, used when the loop
nest is printed as C for the emulator instead of compiled by TVM's LLVM; a
C-source target with the ``hexagon`` key (``c -keys=hexagon,cpu``) has the ISA
too, and its tiles always take that route (:func:`~..topi.intrinsics.target_mode`).
"""
from __future__ import annotations

from .base import DotProductISA, DotVariant, as_i32_vector, llvm_intrin, ordered

_PREFIX = "llvm.hexagon.V6."


def _emit(isa, variant, acc, data, kernel):
    a, b = ordered(variant, data, kernel)
    return llvm_intrin("int32x32", variant.intrinsic, acc, as_i32_vector(a), as_i32_vector(b))


def _supports(target) -> bool:
    """A Hexagon target, or a C-source target for Hexagon (kind ``c`` with the ``hexagon`` key),
    whose code is printed as C and compiled by clang (emulation: :mod:`tvm_tcutils.dotprod.hexagon`).

    Examples
    --------
    >>> import tvm
    >>> [_supports(tvm.target.Target(t)) for t in ("hexagon", "c -keys=hexagon,cpu", "c", "llvm")]
    [True, True, False, False]
    """
    if target is None:
        return False
    return target.kind.name == "hexagon" or (target.kind.name == "c" and "hexagon" in target.keys)


HEXAGON_HVX = DotProductISA(
    name="hexagon_hvx",
    lanes=32,
    variants=(
        DotVariant("uint8", "int8", _PREFIX + "vrmpybusv.acc.128B", extern="tcu_vrmpy_ub_b"),
        DotVariant("int8", "uint8", _PREFIX + "vrmpybusv.acc.128B", swap=True, extern="tcu_vrmpy_b_ub"),
        DotVariant("uint8", "uint8", _PREFIX + "vrmpyubv.acc.128B", extern="tcu_vrmpy_ub_ub"),
        DotVariant("int8", "int8", _PREFIX + "vrmpybv.acc.128B", extern="tcu_vrmpy_b_b"),
    ),
    supports=_supports,
    emitter=_emit,
    registers=32,
    target_keys=("hexagon",),
)
