"""x86 SSE4 fallback (no AVX2): 4 int32 lanes, plain widening arithmetic.

TVM 0.19 sends 8-bit convolutions on any target with SSE4.2 to its own x86
int8 schedule, whose ``pmaddubsw`` step saturates at int16 (wrong results on
full-range data, e.g. ``-mcpu=nehalem`` or ``sandybridge``). This ISA covers
exactly those targets so the package takes that path over: each lane widens
its four bytes to int32 (``pmovzxbd`` / ``pmovsxbd``), multiplies
(``pmulld``) and sums them -- no intermediate can overflow, and every
signedness pair is native. It is slower than a real dot-product instruction
but exact.
"""
from __future__ import annotations

from tvm import tir

from .base import DotProductISA, DotVariant, target_has


def _emit(isa, variant, acc, data, kernel):
    products = tir.Cast(f"int32x{isa.vector_bytes}", data) * tir.Cast(f"int32x{isa.vector_bytes}", kernel)
    for k in range(isa.reduce):
        acc = acc + tir.Shuffle(
            [products], [tir.const(lane * isa.reduce + k, "int32") for lane in range(isa.lanes)]
        )
    return acc


def _supports(target) -> bool:
    # TVM's own int8 x86 path is used from SSE4.2 on; targets with AVX2 get x86_avx2 instead.
    return target_has(target, "sse4.2") and not target_has(target, "avx2")


X86_SSE = DotProductISA(
    name="x86_sse",
    lanes=4,
    variants=tuple(DotVariant(d, k) for d in ("uint8", "int8") for k in ("int8", "uint8")),
    supports=_supports,
    emitter=_emit,
    target_keys=("cpu",),
)
