"""Hexagon HVX 128-byte mode: ``vrmpy`` (32 int32 lanes).

Three instructions cover the signedness pairs: ``vrmpybusv`` (u8 x i8, the
unsigned operand first), ``vrmpyubv`` (u8 x u8) and ``vrmpybv`` (i8 x i8). The
LLVM intrinsics take every HVX register as ``<32 x i32>``. The ``extern`` names
are the C helpers of :mod:`tvm_tcutils.dotprod.hexagon`, used when the loop
nest is printed as C for the emulator instead of compiled by TVM's LLVM.
"""
from __future__ import annotations

from .base import DotProductISA, DotVariant, as_i32_vector, llvm_intrin, ordered

_PREFIX = "llvm.hexagon.V6."


def _emit(isa, variant, acc, data, kernel):
    a, b = ordered(variant, data, kernel)
    return llvm_intrin("int32x32", variant.intrinsic, acc, as_i32_vector(a), as_i32_vector(b))


def _supports(target) -> bool:
    return target is not None and target.kind.name == "hexagon"


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
