"""Rounding back to float in one instruction in the dot-product kernels' epilogues.

The package rounds float32 half to even by adding ``1.5 * 2**23`` (or that plus 128) and reading the
sum's bits as an int32 (:func:`tvm_tcutils.fast_forms.rounded_int32`): exact for ``|x| < 2**22 - 128``,
vectorized by TVM on every target and fused into the kernels. Where the rounded value is wanted as a
float again -- a QDQ residual add reads its conv's result at the rounding
(:func:`tvm_tcutils.fast_forms.round_half_even`) -- that form costs three vector instructions (the float
add, an integer add, the conversion back). ``llvm.nearbyint`` (round in the current mode, which is half
to even) is one: ``vrndscaleps`` with AVX-512. TVM's vectorizer scalarizes ``nearbyint``, so Relay and TE
keep the bit form; :func:`round_to_float` rewrites it in the final TIR instead, where the lanes are
already vectors, inside ``target.build.llvm`` (:mod:`.hooks`), before :mod:`.pipeline`.

It rewrites ``float32(reinterpret_int32(x + S) + c)`` with ``S`` one of :data:`SHIFTS` and an integer
constant ``c`` into ``nearbyint(x) + (c + bits(S))`` (the add left out when it is 0): the same value
wherever the bit form is exact. Measured among a 1x1 conv's products with 64 input channels
(``scripts/probe_epilogue_overlap.py``, Zen 4): the residual epilogue went from 1.25-1.39x to
1.16-1.32x the products' time. Only functions whose products use an ISA of :data:`MEASURED_ISAS` change.

The 8-bit results take the second shift (``1.5 * 2**23 + 128``) where their offset is a multiple of 256
(:func:`tvm_tcutils.fast_forms.rounded_int32`: on Zen 4 LLVM's narrowing store, ``vpmovdb`` to memory,
was slower than narrowing in a register and adding 128 there). On targets with a tile engine (Intel
Xeons) :func:`narrow_directly` gives them the first shift back, whose offset add LLVM drops: one
instruction less per 16 outputs.
"""
from __future__ import annotations

import logging
from typing import Optional, Tuple

from .._tvm import tvm
from tvm import tir

from ..fast_forms import ROUNDING_SHIFTS, float_bits
from . import isa, pipeline

logger = logging.getLogger("tvm_tcutils.dotprod.rounding")

#: The rounding shifts of :func:`tvm_tcutils.fast_forms.rounded_int32`.
SHIFTS = ROUNDING_SHIFTS

#: ISAs whose kernels were measured faster with ``nearbyint``: AVX-512 VNNI (``vrndscaleps``, on Zen 4)
#: and the AMX tile kernels, whose epilogues are AVX-512 too (Emerald Rapids, whole models,
#: ``scripts/probe_epilogue_forms.py``: ResNet-18 x0.994 [0.991, 0.999], MobileNet-v2 x0.988, ResNet-50
#: level within its noise). AVX2 and SSE kernels (``vroundps`` / ``roundps``) and HVX (no single
#: instruction) keep the bit form.
MEASURED_ISAS = frozenset({"x86_vnni", "x86_amx"})


def _constant(expr: tir.PrimExpr) -> Optional[float]:
    """The value of a scalar constant or of a broadcast one, else None."""
    if isinstance(expr, tir.Broadcast):
        expr = expr.value
    return expr.value if isinstance(expr, (tir.IntImm, tir.FloatImm)) else None


def _bit_rounding(expr: tir.PrimExpr) -> Optional[Tuple[tir.PrimExpr, int, float]]:
    """``(x, k, S)`` of ``reinterpret_int32(x + S) + c`` (or ``- c``) with ``k = c + bits(S)``, i.e. the
    value ``round_half_even(x) + k``; else None."""
    if isinstance(expr, (tir.Add, tir.Sub)):
        offset, bits = _constant(expr.b), expr.a
        if offset is not None and isinstance(expr, tir.Sub):
            offset = -offset
    else:
        offset, bits = 0, expr
    if offset is None or not isinstance(bits, tir.Call) or not bits.op.same_as(tvm.ir.Op.get("tir.reinterpret")):
        return None
    shifted = bits.args[0]
    if tvm.DataType(bits.dtype).type_code != tvm.DataTypeCode.INT or tvm.DataType(bits.dtype).bits != 32 \
            or not isinstance(shifted, tir.Add):
        return None
    shift = _constant(shifted.b)
    if shift not in SHIFTS:
        return None
    return shifted.a, int(offset) + float_bits(shift), shift


def round_to_float(func: tir.PrimFunc) -> Tuple[tir.PrimFunc, int]:
    """``(func, count)``: each float32 cast of a bit-form rounding in ``func`` as ``llvm.nearbyint``.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((16,), name="x")
    >>> y = te.compute((16,), lambda i: (tvm.tir.reinterpret("int32", x[i] + tvm.tir.const(SHIFTS[1], "float32"))
    ...                                  + (3 - float_bits(SHIFTS[1]))).astype("float32"), name="y")
    >>> func, count = round_to_float(tvm.lower(te.create_schedule(y.op), [x, y])["main"])
    >>> count, "reinterpret" in func.script()  # nearbyint(x) + 3.0
    (1, False)
    """
    nearbyint = tvm.target.codegen.llvm_lookup_intrinsic_id("llvm.nearbyint")

    def rewrite(cast):
        if tvm.DataType(cast.dtype).type_code != tvm.DataTypeCode.FLOAT or tvm.DataType(cast.dtype).bits != 32:
            return None
        parts = _bit_rounding(cast.value)
        if parts is None or parts[0].dtype != cast.dtype:
            return None
        value, offset, _ = parts
        rounded = tir.call_llvm_pure_intrin(cast.dtype, nearbyint, tir.const(1, "uint32"), value)
        return rounded if offset == 0 else rounded + tir.const(float(offset), cast.dtype)

    return pipeline.rewrite_nodes(func, rewrite, ["tir.Cast"])


def narrow_directly(func: tir.PrimFunc) -> Tuple[tir.PrimFunc, int]:
    """``(func, count)``: each 8-bit cast of a bit-form rounding with the second shift of :data:`SHIFTS`
    rewritten to the first (its constant adjusted): the same value wherever the bit form is exact.

    Examples
    --------
    An 8-bit store of ``round(v)`` with a zero point of 0, as the QDQ legalization writes it:

    >>> v = tvm.tir.Var("v", "float32")
    >>> bits = tvm.tir.reinterpret("int32", v + tvm.tir.const(SHIFTS[1], "float32"))
    >>> store = tvm.tir.Evaluate((bits - float_bits(SHIFTS[1])).astype("uint8"))
    >>> func, count = narrow_directly(tvm.tir.PrimFunc([v], store))
    >>> count, str(float(SHIFTS[0])) in func.script()
    (1, True)
    """
    def rewrite(cast):
        dtype = tvm.DataType(cast.dtype)
        if dtype.bits != 8 or dtype.type_code not in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT):
            return None
        parts = _bit_rounding(cast.value)
        if parts is None or parts[2] != SHIFTS[1]:
            return None
        value, offset, _ = parts
        lanes = tvm.DataType(value.dtype).lanes
        bits = tir.reinterpret(f"int32x{lanes}" if lanes > 1 else "int32",
                               value + tir.const(SHIFTS[0], value.dtype))
        return (bits + tir.const(offset - float_bits(SHIFTS[0]), bits.dtype)).astype(cast.dtype)

    return pipeline.rewrite_nodes(func, rewrite, ["tir.Cast"])


def _measured(func: tir.PrimFunc) -> bool:
    isas = pipeline.product_isas(func.body)
    return bool(isas) and isas <= MEASURED_ISAS


def _rewrite(func: tir.PrimFunc, narrow: bool) -> Tuple[tir.PrimFunc, int]:
    if not _measured(func):
        return func, 0
    func, rounded = round_to_float(func)
    narrowed = 0
    if narrow:
        func, narrowed = narrow_directly(func)
    return func, rounded + narrowed


def rounding_module(mod: tvm.IRModule, target=None) -> tvm.IRModule:
    """:func:`round_to_float` on each product function of ``mod`` whose ISAs are in :data:`MEASURED_ISAS`
    (dot-product steps or tiles), and :func:`narrow_directly` too where ``target`` has a tile engine (the
    module itself when nothing changes).

    Examples
    --------
    A kernel with the bit form but no dot-product instruction (a float model's) is left alone:

    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((16,), name="x")
    >>> bits = lambda i: tvm.tir.reinterpret("int32", x[i] + tvm.tir.const(SHIFTS[0], "float32"))
    >>> y = te.compute((16,), lambda i: (bits(i) - float_bits(SHIFTS[0])).astype("float32"), name="y")
    >>> mod = tvm.lower(te.create_schedule(y.op), [x, y])
    >>> rounding_module(mod).same_as(mod), round_to_float(mod["main"])[1]
    (True, 1)
    """
    narrow = target is not None and isa.tile_isa(tvm.target.Target(target)) is not None
    return pipeline.rewrite_functions(mod, lambda func: _rewrite(func, narrow), logger,
                                      "rewrote %d roundings (llvm.nearbyint, direct 8-bit narrowing)")
