"""x86 AVX2 fallback: 8 int32 lanes, bit-exact on full-range 8-bit operands.

``vpmaddubsw`` (the usual AVX2 int8 step) adds two u8 x i8 products in int16
with saturation, so 255*127 + 255*127 is clipped and the int32 result is
wrong. This emitter widens both operands to int16 first (``vpmovzxbw`` /
``vpmovsxbw``), regroups them so that one ``vpmaddwd`` (int16 x int16,
pairwise sum in int32, exact for 8-bit inputs) covers products 0-1 of every
lane and a second one products 2-3, and adds both to the accumulator.
Because nothing saturates, every signedness pair is native here.
"""
from __future__ import annotations

from tvm import tir

from .base import DotProductISA, DotVariant, llvm_intrin, reinterpret, target_has

INTRINSIC = "llvm.x86.avx2.pmadd.wd"


def _pairs(vec: tir.PrimExpr):
    """Widen an 8-bit x32 vector (8 lanes x 4) to int16 and regroup it by product pair.

    Returns two int16 x16 vectors: the first holds elements 0 and 1 of every lane, the second
    elements 2 and 3 (one int32-sized pair per lane), so that one ``vpmaddwd`` on each yields
    a partial sum per lane with no shuffle of its result.
    """
    pairs = reinterpret(tir.Cast("int16x32", vec), "int32x16")  # pair p of lane l at 2l + p
    first = tir.Shuffle([pairs], [tir.const(i, "int32") for i in range(0, 16, 2)])
    second = tir.Shuffle([pairs], [tir.const(i, "int32") for i in range(1, 16, 2)])
    return reinterpret(first, "int16x16"), reinterpret(second, "int16x16")


def _emit(isa, variant, acc, data, kernel):
    # The regrouping depends on one operand only: the data operand is a broadcast (its regrouping
    # folds into the broadcast), and the kernel's is the same for every output pixel of the
    # register tile, so LLVM computes it once per kernel load; the products then go straight
    # into the accumulator (two vpmaddwd, two vpaddd per step).
    (d_01, d_23), (k_01, k_23) = _pairs(data), _pairs(kernel)
    return (acc + llvm_intrin("int32x8", variant.intrinsic, d_01, k_01)
            + llvm_intrin("int32x8", variant.intrinsic, d_23, k_23))


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
