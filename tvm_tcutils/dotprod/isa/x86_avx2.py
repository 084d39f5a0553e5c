"""x86 AVX2 fallback: 8 int32 lanes, bit-exact on full-range 8-bit operands.

``vpmaddubsw`` (the usual AVX2 int8 step) adds two u8 x i8 products in int16
with saturation, so 255*127 + 255*127 is clipped and the int32 result is
wrong. This emitter widens both operands to int16 first and uses ``vpmaddwd``
(int16 x int16, pairwise sum in int32, exact for 8-bit inputs): one covers
products 0-1 of every lane, a second one products 2-3, and both add straight
into the accumulator. Because nothing saturates, every signedness pair is
native here.

The widening is written as one byte shuffle per product pair that stays inside
each 128-bit half (lanes 0-3 live in the low half, 4-7 in the high half, for the
kernel block and for the broadcast data word alike), so LLVM emits a single
``vpshufb`` (plus ``vpsraw`` to sign-extend) instead of a cross-lane
``vpmovsxbw`` and the shuffles that regroup its result.

conv2d widens neither operand at run time: its data is widened once per run
(``wide_data``) and its kernel at compile time (``wide_kernel``: packed as
int16 pairs, ``OIHW{b/2}i8o2i``), so its step is two ``vpbroadcastd`` loads, two
``vpmaddwd`` and two ``vpaddd``.
"""
from __future__ import annotations

from tvm import tir

from .base import DotProductISA, DotVariant, llvm_intrin, reinterpret, target_has

INTRINSIC = "llvm.x86.avx2.pmadd.wd"

_BYTES = 32  # 8 lanes x 4 products


def _pair_words(vec: tir.PrimExpr, pair: int) -> tir.PrimExpr:
    """Products ``2*pair`` and ``2*pair + 1`` of every lane, widened to ``int16x16``.

    Word ``2l + j`` holds byte ``4l + 2*pair + j``. A signed byte goes to the high byte of its
    word and is shifted back arithmetically (sign extension); an unsigned one goes to the low
    byte with a zero above it.
    """
    dtype = str(vec.dtype).split("x")[0]
    signed = dtype == "int8"
    zero_index = _BYTES  # first byte of the zero vector appended to the shuffle's input
    indices = []
    for lane in range(_BYTES // 4):
        for j in range(2):
            byte = 4 * lane + 2 * pair + j
            indices += [zero_index, byte] if signed else [byte, zero_index]
    zeros = tir.Broadcast(tir.const(0, dtype), _BYTES)
    words = reinterpret(tir.Shuffle([vec, zeros], [tir.const(i, "int32") for i in indices]), "int16x16")
    return words >> tir.Broadcast(tir.const(8, "int16"), 16) if signed else words


def _wide_data_words(buffer: tir.Buffer):
    """The two data operands of a step from 4 data values already widened to int16.

    Each product pair is one 32-bit word, broadcast to the 8 lanes: a single
    ``vpbroadcastd`` from memory, where 8-bit data needs a broadcast and two shuffles.
    """
    return tuple(
        reinterpret(tir.Broadcast(reinterpret(buffer.vload([2 * pair], "int16x2"), "int32"), 8), "int16x16")
        for pair in (0, 1)
    )


def _emit(isa, variant, acc, data, kernel):
    # ``data`` is a broadcast 8-bit word (dense), widened here per step, or the two words
    # ``_wide_data_words`` read (conv2d, whose data was widened once). ``kernel`` is an 8-bit
    # block (dense), whose shuffles are shared by every row of the register tile, or the two
    # pair vectors of conv2d's kernel, packed widened at compile time.
    words = data if isinstance(data, tuple) else (_pair_words(data, 0), _pair_words(data, 1))
    kernel_words = kernel if isinstance(kernel, tuple) else (_pair_words(kernel, 0), _pair_words(kernel, 1))
    for pair in (0, 1):
        acc = acc + llvm_intrin("int32x8", variant.intrinsic, words[pair], kernel_words[pair])
    return acc


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
    operand_registers=2,
    # The byte-shuffle masks (two pairs x signed / unsigned) of dense's widening. conv2d, with
    # its widened kernel, needs none, but its 8-accumulator tiles this budget gives measured as
    # fast as 4-12 accumulator ones on ResNet-50 layers, so the one budget serves both.
    constant_registers=4,
    wide_data="int16",
    wide_loader=_wide_data_words,
    wide_kernel="int16",
    wide_group=2,
)
