"""x86 AVX2 reduce-range step: ``vpmaddubsw`` + ``vpmaddwd`` on kernels whose values cannot saturate.

``vpmaddubsw`` multiplies 32 u8 x s8 byte pairs and adds each two adjacent
products into a *saturating* int16; ``vpmaddwd`` by a vector of ones then adds
each two adjacent int16 into an int32 lane, so one instruction pair computes
``acc[l] += sum_{k<4} a[4l+k] * w[4l+k]`` for 8 lanes -- 3 vector operations
per 32 products where the exact step (:mod:`.x86_avx2`) needs 4.

It is exact only when no int16 pair sum leaves [-32768, 32767]. With data in
[0, 255] and every kernel value in [-64, 64] (what quantizers' *reduce-range*
mode writes: onnxruntime's ``reduce_range=True`` gives int8 weights in
[-64, 64]), ``|a0*w0 + a1*w1| <= 2 * 255 * 64 = 32640``: nothing saturates, so
the result is bit-exact. The package therefore takes this step per layer, only
for a constant kernel whose values it has checked (:attr:`~.base.DotProductISA.kernel_range`),
and only on AVX2 targets without VNNI (``vpdpbusd`` is exact and faster there);
every other kernel keeps the exact step.

A kernel packed for this step carries a mark that no other kernel has, so that
no hand-packed 8-bit kernel (and no layer sharing a compiled function with an
unchecked one) reaches the saturating instruction: conv2d's kernel layout has
a unit axis (``OIHW1h{b/4}i8o4i``, 8-D, the same bytes as ``OIHW{b/4}i8o4i``),
dense's packed weight one zero quad more than the data needs
(:mod:`~tvm_tcutils.dotprod.topi.packing`).
"""
from __future__ import annotations

from tvm import tir

from .base import DotProductISA, DotVariant, llvm_intrin, reinterpret, target_has

#: u8 x s8 byte pairs summed into saturating int16 words.
PAIR_INTRINSIC = "llvm.x86.avx2.pmadd.ub.sw"
#: int16 pairs summed into int32 lanes (here: by ones, widening the words exactly).
WIDEN_INTRINSIC = "llvm.x86.avx2.pmadd.wd"

#: Kernel values for which ``vpmaddubsw`` cannot saturate on u8 data: 2 * 255 * 64 <= 32767.
KERNEL_RANGE = (-64, 64)


def _emit(isa, variant, acc, data, kernel):
    words = llvm_intrin(
        "int16x16", PAIR_INTRINSIC, reinterpret(data, "int8x32"), reinterpret(kernel, "int8x32")
    )
    ones = tir.Broadcast(tir.const(1, "int16"), 16)
    return acc + llvm_intrin("int32x8", WIDEN_INTRINSIC, words, ones)


def _supports(target) -> bool:
    # On VNNI targets vpdpbusd is exact on any data and does the work of all three instructions.
    return target_has(target, "avx2") and not target_has(target, "avx512vnni")


X86_AVX2_U8S7 = DotProductISA(
    name="x86_avx2_u8s7",
    lanes=8,
    variants=(DotVariant("uint8", "int8", PAIR_INTRINSIC),),
    supports=_supports,
    emitter=_emit,
    target_keys=("cpu",),
    constant_registers=1,  # the ones vector
    kernel_range=KERNEL_RANGE,
)
