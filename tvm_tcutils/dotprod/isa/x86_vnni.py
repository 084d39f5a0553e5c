"""x86 AVX-512 VNNI: ``vpdpbusd`` on 512-bit registers (16 int32 lanes, u8 x i8).

LLVM changed the intrinsic's operand types: up to LLVM 21 the byte operands
are declared as ``<16 x i32>``; LLVM 22 declares them ``<64 x i8>`` and an IR
call with the old types aborts LLVM ("Calling a function with a bad
signature!"). The emitter reads the LLVM version TVM was built with and
passes the operands with the types that LLVM declares.
"""
from __future__ import annotations

from .base import (
    DotProductISA, DotVariant, as_i32_vector, llvm_intrin, llvm_major, ordered, reinterpret, target_has,
)

INTRINSIC = "llvm.x86.avx512.vpdpbusd.512"

#: First LLVM major whose vpdpbusd intrinsics take byte vectors.
BYTE_OPERANDS_SINCE = 22


def operand_types(llvm_major_version: int):
    """The (acc, a, b) LLVM vector types of :data:`INTRINSIC` in an LLVM version.

    Examples
    --------
    >>> operand_types(22)
    ('int32x16', 'int8x64', 'int8x64')
    >>> operand_types(17)
    ('int32x16', 'int32x16', 'int32x16')
    """
    if llvm_major_version >= BYTE_OPERANDS_SINCE:
        return ("int32x16", "int8x64", "int8x64")
    return ("int32x16", "int32x16", "int32x16")


def _emit(isa, variant, acc, data, kernel):
    a, b = ordered(variant, data, kernel)
    _, a_type, b_type = operand_types(llvm_major())
    a = reinterpret(a, a_type) if a_type.startswith("int8") else as_i32_vector(a)
    b = reinterpret(b, b_type) if b_type.startswith("int8") else as_i32_vector(b)
    return llvm_intrin("int32x16", variant.intrinsic, acc, a, b)


def _supports(target) -> bool:
    return target_has(target, "avx512vnni")


X86_VNNI = DotProductISA(
    name="x86_vnni",
    lanes=16,
    variants=(DotVariant("uint8", "int8", INTRINSIC), DotVariant("int8", "uint8", INTRINSIC, swap=True)),
    supports=_supports,
    emitter=_emit,
    registers=32,
    target_keys=("cpu",),
    # 2 blocks x 4 pixels (8 accumulators) beat the budget-filling 2 x 8 by 3-40 % on ResNet-50's
    # 56x56 and 28x28 layers here (Zen 4: 64-channel 1x1 324 -> 456 GOPS; 256->64 1x1 416 -> 456;
    # 3x3 442 -> 460; 128->512 1x1 even); 14x14 and 7x7 planes have no such block and keep filling.
    conv_tile_pixels=4,
    accumulating=True,  # vpdpbusd takes the accumulator: cpu_facts can measure its chains
    # A CPU with more vpdpbusd in flight than those 8 accumulators widens the block (conv_pixels, from
    # the measured dotprod.cpu_facts): Zen 4 keeps 4 in flight (one a cycle, in two halves, latency 4)
    # and keeps the block; Zen 5 about 9-10 (two a cycle), where a 1x7 row (14) measured 8-29 % faster
    # than the 2x2 block on 13 of ResNet-50's 56x56-14x14 convs, level or slower on none but the
    # 64-channel 1x1s, which keep the small tile (conv2d's SHORT_REDUCTION;
    # docs/benchmarks/data/probe_conv_tiles_zen5.json). Dense keeps its tile: 4 rows x 4 blocks (16
    # accumulators) measured 11-14 % faster than 4 x 2 alone on bert-tiny's 128-token products on Zen 5,
    # yet bert-tiny ran 1.81 -> 2.56 ms (QDQ) and 1.99 -> 2.75 ms (dynamic) with it.
)
