"""x86 AVX2 fallback: 8 int32 lanes, bit-exact on full-range 8-bit operands.

``vpmaddubsw`` (the usual AVX2 int8 step) adds two u8 x i8 products in int16
with saturation, so 255*127 + 255*127 is clipped and the int32 result is
wrong. This emitter widens both operands to int16 first (``vpmovzxbw`` /
``vpmovsxbw``) and uses ``vpmaddwd`` (int16 x int16, pairwise sum in int32,
exact for 8-bit inputs), then adds the two int32 pair-sums of each lane.
Because nothing saturates, every signedness pair is native here.
"""
from __future__ import annotations

from tvm import tir

from .base import DotProductISA, DotVariant, llvm_intrin, target_has

INTRINSIC = "llvm.x86.avx2.pmadd.wd"


def _halves(vec: tir.PrimExpr):
    """Widen an 8-bit x32 vector to int16 and split it in two int16 x16 halves."""
    wide = tir.Cast("int16x32", vec)
    return (
        tir.Shuffle([wide], [tir.const(i, "int32") for i in range(16)]),
        tir.Shuffle([wide], [tir.const(i, "int32") for i in range(16, 32)]),
    )


def _emit(isa, variant, acc, data, kernel):
    (d_lo, d_hi), (k_lo, k_hi) = _halves(data), _halves(kernel)
    # Each vpmaddwd yields 8 pair-sums: lanes 0-3 (lo) and 4-7 (hi), two per lane.
    p_lo = llvm_intrin("int32x8", variant.intrinsic, d_lo, k_lo)
    p_hi = llvm_intrin("int32x8", variant.intrinsic, d_hi, k_hi)
    even = tir.Shuffle([p_lo, p_hi], [tir.const(i, "int32") for i in range(0, 16, 2)])
    odd = tir.Shuffle([p_lo, p_hi], [tir.const(i, "int32") for i in range(1, 16, 2)])
    return acc + even + odd


def _supports(target) -> bool:
    return target_has(target, "avx2")


X86_AVX2 = DotProductISA(
    name="x86_avx2",
    lanes=8,
    variants=tuple(
        DotVariant(d, k, INTRINSIC) for d in ("uint8", "int8") for k in ("int8", "uint8")
    ),
    supports=_supports,
    emitter=_emit,
    target_keys=("cpu",),
)
