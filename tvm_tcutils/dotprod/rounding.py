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
Xeons) or AVX-512BW :func:`narrow_directly` gives them the first shift back, whose offset add LLVM drops:
one instruction less per 16 outputs; :func:`narrow_by_packs` then stores runs of 2-4 such vectors at once
through AVX-512BW's saturating packs, which do the clamp's work too (all of it where the value is bounded,
:func:`float_bounds`), so that the slow store is left only to a loop's odd last vector (:func:`narrowing`).
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Dict, List, Optional, Tuple

from .._tvm import target_has, tvm
from tvm import tir
from tvm.tir import stmt_functor

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


#: Lanes of one narrowed vector (a 512-bit register of int32).
PACK_LANES = 16

#: Most consecutive vectors a loop may store for :func:`narrow_by_packs` to unroll it: groups of four (a
#: 64-byte store), then of two (32 bytes); a last odd one keeps its own narrowing.
MAX_PACKED_VECTORS = 16

#: The saturating packs of AVX-512BW and the rounding conversion, by output signedness.
_PACK_INTRINSICS = {"dwords": "llvm.x86.avx512.packssdw.512", "uint8": "llvm.x86.avx512.packuswb.512",
                    "int8": "llvm.x86.avx512.packsswb.512", "round": "llvm.x86.avx512.mask.cvtps2dq.512"}

#: The 8-bit range each output type saturates to.
_BYTE_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def _element(dtype: str) -> str:
    """The element type of a (vector) dtype string: ``uint8`` of ``uint8x16``."""
    return str(dtype).split("x")[0]


def _clamped(expr: tir.PrimExpr) -> Optional[Tuple[tir.PrimExpr, float, float]]:
    """``(y, lo, hi)`` of ``max(min(y, hi), lo)`` or ``min(max(y, lo), hi)`` with constant bounds, else None."""
    outer_kinds = {tir.Max: tir.Min, tir.Min: tir.Max}
    inner_kind = outer_kinds.get(type(expr))
    if inner_kind is None or not isinstance(expr.a, inner_kind):
        return None
    outer, inner = _constant(expr.b), _constant(expr.a.b)
    if outer is None or inner is None:
        return None
    lo, hi = (outer, inner) if isinstance(expr, tir.Max) else (inner, outer)
    return expr.a.a, lo, hi


def _packable(store: tir.BufferStore) -> Optional[Tuple[tir.PrimExpr, float, int]]:
    """``(y, hi, k)`` of a 16-lane 8-bit store of ``round(clamp(y, lo, hi)) + k`` (the bit form) whose
    clamp is exactly the output type's range shifted by ``k``, so that saturating packs of
    ``round(min(y, hi)) + k`` store the same bytes; else None."""
    value = store.value
    dtype = tvm.DataType(value.dtype)
    if not isinstance(value, tir.Cast) or dtype.lanes != PACK_LANES or _element(value.dtype) not in _BYTE_RANGE \
            or len(store.indices) != 1 or not isinstance(store.indices[0], tir.Ramp):
        return None
    parts = _bit_rounding(value.value)
    clamp = parts and _clamped(parts[0])
    if not clamp or tvm.DataType(clamp[0].dtype) != tvm.DataType(f"float32x{PACK_LANES}"):
        return None
    y, lo, hi = clamp
    low, high = _BYTE_RANGE[_element(value.dtype)]
    k = parts[1]
    if lo != low - k or hi != high - k:
        return None
    return y, hi, k


def _reads(expr: tir.PrimExpr, data: tir.Var) -> bool:
    found = []
    stmt_functor.post_order_visit(expr, lambda n: found.append(
        isinstance(n, tir.BufferLoad) and n.buffer.data.same_as(data)))
    return any(found)


@functools.lru_cache(maxsize=None)
def _pack_ids() -> Dict[str, int]:
    """LLVM's id of each of :data:`_PACK_INTRINSICS`, looked up once."""
    return {name: tvm.target.codegen.llvm_lookup_intrinsic_id(intrinsic)
            for name, intrinsic in _PACK_INTRINSICS.items()}


def _packs(words: List[tir.PrimExpr], byte: str) -> tir.PrimExpr:
    """The bytes of 2 or 4 int32 vectors (``words``), saturated to ``byte`` by the packs, in order."""
    ids = _pack_ids()
    halves = [tir.call_llvm_pure_intrin(f"int16x{2 * PACK_LANES}", ids["dwords"], tir.const(0, "uint32"),
                                        words[i], words[i + 1]) for i in range(0, len(words), 2)]
    packed = tir.call_llvm_pure_intrin(f"{byte}x{4 * PACK_LANES}", ids[byte], tir.const(0, "uint32"),
                                       halves[0], halves[-1])
    # Each 128-bit lane of the packs holds 4 bytes of every vector in turn: byte b of vector j's
    # quarter q sits at 16 q + 4 j + b.
    order = [16 * (e // 4) + 4 * j + e % 4 for j in range(len(words)) for e in range(PACK_LANES)]
    return tir.Shuffle([packed], [tir.const(i, "int32") for i in order])


#: The largest magnitude :func:`_rounded_words` converts without its ``min``: ``vcvtps2dq`` is exact below
#: 2**31 and the offset ``k`` (at most 255) added after it must not wrap; a power of two leaves room for both.
UNCLAMPED_LIMIT = float(2 ** 30)

_INFINITE = (-float("inf"), float("inf"))


def _product(a: float, b: float) -> float:
    # An infinite bound stands for "unbounded but finite": zero times it is zero, not NaN.
    return 0.0 if a == 0 or b == 0 else a * b


def float_bounds(expr: tir.PrimExpr, analyzer: Optional[tvm.arith.Analyzer] = None) -> Tuple[float, float]:
    """``(lo, hi)``: bounds of every lane of the float expression ``expr`` (infinite where unknown).

    Integer parts are bounded by TVM's ``const_int_bound`` (an 8-bit load is within its type), float
    loads are unbounded, and ``+ - *``, ``min``/``max`` (TVM's, which map NaN to their second operand),
    ``nearbyint`` and ``select`` carry bounds through; float32 rounding widens a result by at most one
    unit in its last place, which the caller's margin (:data:`UNCLAMPED_LIMIT`) covers.

    Examples
    --------
    A QDQ residual add: an 8-bit intermediate scaled, plus an 8-bit load scaled:

    >>> x, r = tvm.tir.Var("x", "float32"), tvm.tir.Var("r", "uint8")
    >>> q = tvm.tir.max(tvm.tir.min(x * 3.0, tvm.tir.const(125.0)), tvm.tir.const(-130.0))
    >>> float_bounds(q * 0.5 + r.astype("float32") * 2.0)
    (-65.0, 572.5)
    >>> float_bounds(x * 2.0)
    (-inf, inf)
    """
    analyzer = analyzer or tvm.arith.Analyzer()
    kind = tvm.DataType(expr.dtype).type_code
    if kind in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT):
        bound = analyzer.const_int_bound(expr)
        return float(bound.min_value), float(bound.max_value)
    if isinstance(expr, (tir.FloatImm, tir.IntImm)):
        return float(expr.value), float(expr.value)
    if isinstance(expr, (tir.Broadcast, tir.Cast)):
        return float_bounds(expr.value, analyzer)
    if isinstance(expr, (tir.Add, tir.Sub, tir.Mul, tir.Min, tir.Max)):
        (a_lo, a_hi), (b_lo, b_hi) = float_bounds(expr.a, analyzer), float_bounds(expr.b, analyzer)
        if isinstance(expr, (tir.Add, tir.Sub)):
            lo, hi = (a_lo + b_lo, a_hi + b_hi) if isinstance(expr, tir.Add) else (a_lo - b_hi, a_hi - b_lo)
            return _INFINITE if math.isnan(lo) or math.isnan(hi) else (lo, hi)  # inf - inf: unknown
        if isinstance(expr, tir.Mul):
            corners = [_product(a, b) for a in (a_lo, a_hi) for b in (b_lo, b_hi)]
            return min(corners), max(corners)
        # TVM lowers min(a, b) to a < b ? a : b: a NaN in a gives b; b is the constant bound here.
        if isinstance(expr, tir.Min):
            return min(a_lo, b_lo), min(a_hi, b_hi)
        return max(a_lo, b_lo), max(a_hi, b_hi)
    if isinstance(expr, tir.Select):
        (t_lo, t_hi), (f_lo, f_hi) = float_bounds(expr.true_value, analyzer), float_bounds(expr.false_value, analyzer)
        return min(t_lo, f_lo), max(t_hi, f_hi)
    intrinsic = pipeline.intrinsic_name(expr) if isinstance(expr, tir.Call) \
        and expr.op.same_as(tvm.ir.Op.get("tir.call_llvm_pure_intrin")) else None
    if intrinsic == "llvm.nearbyint":
        lo, hi = float_bounds(expr.args[2], analyzer)
        return (math.floor(lo) if math.isfinite(lo) else lo), (math.ceil(hi) if math.isfinite(hi) else hi)
    if intrinsic in ("llvm.fmuladd", "llvm.fma"):  # a * b + c, as the package's epilogues fuse it
        a, b, c = expr.args[2:5]
        return float_bounds(tir.Add(tir.Mul(a, b), c), analyzer)
    return _INFINITE


def _rounded_words(y: tir.PrimExpr, hi: float, k: int, clamp: bool = True) -> tir.PrimExpr:
    """``round(min(y, hi)) + k`` as int32 lanes (``vcvtps2dq``: the current mode, half to even); without
    the ``min`` where ``clamp`` is False (``y`` bounded well inside int32: the packs saturate it)."""
    if clamp:
        y = tir.Min(y, tir.Broadcast(tir.const(hi, "float32"), PACK_LANES))
    rounded = tir.call_llvm_pure_intrin(
        f"int32x{PACK_LANES}", _pack_ids()["round"],
        tir.const(0, "uint32"), y,
        tir.Broadcast(tir.const(0, "int32"), PACK_LANES), tir.const(-1, "int16"), tir.const(4, "int32"))
    return rounded if k == 0 else rounded + tir.Broadcast(tir.const(k, "int32"), PACK_LANES)


def _packed_stores(loop: tir.For) -> Optional[tir.Stmt]:
    """The stores of a loop of :func:`_packable` stores to consecutive 16-byte runs, unrolled as packed
    groups of 4 and 2 vectors (a last odd vector as it was), else None."""
    extent = _constant(loop.extent)
    if extent is None or not 2 <= extent <= MAX_PACKED_VECTORS or _constant(loop.min) != 0 \
            or loop.kind not in (tir.ForKind.SERIAL, tir.ForKind.UNROLLED):
        return None
    lets, body = [], loop.body
    while isinstance(body, tir.LetStmt):
        lets.append(body)
        body = body.body
    parts = _packable(body) if isinstance(body, tir.BufferStore) else None
    if parts is None:
        return None

    def inline(expr):
        for let in reversed(lets):
            expr = stmt_functor.substitute(expr, {let.var: let.value})
        return expr

    def at(expr, j: int):
        return stmt_functor.substitute(expr, {loop.loop_var: tir.const(j, loop.loop_var.dtype)})

    (y, hi, k), value, index = parts, inline(body.value), inline(body.indices[0])
    y = inline(y)
    if _constant(index.stride) != 1 or _reads(y, body.buffer.data):
        return None
    extent = int(extent)
    analyzer = tvm.arith.Analyzer()
    bases = [analyzer.simplify(at(index.base, j)) for j in range(extent)]
    if not all(analyzer.can_prove_equal(b - bases[0], PACK_LANES * j) for j, b in enumerate(bases)):
        return None
    # A QDQ residual add's y (two 8-bit values scaled) is bounded: its clamp's min is the packs' work.
    clamp = not max(map(abs, float_bounds(y, analyzer))) < UNCLAMPED_LIMIT
    byte, stores, j = _element(body.value.dtype), [], 0
    while j < extent:
        group = 4 if extent - j >= 4 else 2 if extent - j >= 2 else 1
        if group == 1:
            stores.append(tir.BufferStore(body.buffer, at(value, j), [at(index, j)]))
        else:
            words = [_rounded_words(at(y, i), hi, k, clamp) for i in range(j, j + group)]
            stores.append(tir.BufferStore(body.buffer, _packs(words, byte),
                                          [tir.Ramp(bases[j], 1, group * PACK_LANES)]))
        j += group
    return tir.SeqStmt(stores) if len(stores) > 1 else stores[0]


def narrow_by_packs(func: tir.PrimFunc) -> Tuple[tir.PrimFunc, int]:
    """``(func, count)``: each loop of 2 to :data:`MAX_PACKED_VECTORS` consecutive 16-lane 8-bit stores
    of a clamped bit-form rounding unrolled into stores of 4 or 2 vectors at once: each vector rounded by
    ``vcvtps2dq`` (half to even, the default mode) and narrowed by AVX-512BW's saturating packs and one
    lane shuffle. The same bytes wherever the clamp is the output type's range: the packs saturate where
    the clamp bounded, and ``min(y, hi)`` stays so that no value past the int32 range is converted --
    unless :func:`float_bounds` puts ``y`` within :data:`UNCLAMPED_LIMIT` (a QDQ residual add's sum of
    two scaled 8-bit values): then the packs do the whole clamp, one ``vminps`` fewer per 16 outputs.

    Per pair of vectors that is 5 vector instructions against 10 (two clamps, the shift add and the
    2-instruction ``vpmovdb`` each) on the two 512-bit ports the tile kernels' epilogues are bound by.
    Whole models on Emerald Rapids, the same builds with and without it in turns (bit-identical):
    ResNet-50 x0.969 [0.961, 0.974], ResNet-18 x0.978 [0.971, 0.985], MobileNet-v2 x0.954 [0.923,
    0.960]. Applied on tile targets and AVX-512BW ones (:func:`narrowing`).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((32,), name="x")
    >>> def byte(i):
    ...     clamped = te.max(te.min(x[i], tvm.tir.const(255.0)), tvm.tir.const(0.0))
    ...     bits = tvm.tir.reinterpret("int32", clamped + tvm.tir.const(SHIFTS[0], "float32"))
    ...     return (bits - float_bits(SHIFTS[0])).astype("uint8")
    >>> y = te.compute((32,), byte, name="y")
    >>> s = te.create_schedule(y.op)
    >>> outer, inner = s[y].split(y.op.axis[0], 16)
    >>> s[y].vectorize(inner)
    >>> func, count = narrow_by_packs(tvm.lower(s, [x, y])["main"])
    >>> count, "packuswb" in func.script()
    (1, True)
    """
    return pipeline.rewrite_nodes(func, _packed_stores, ["tir.For"])


def _measured(func: tir.PrimFunc) -> bool:
    isas = pipeline.product_isas(func.body)
    return bool(isas) and isas <= MEASURED_ISAS


def _rewrite(func: tir.PrimFunc, narrow: bool, packs: bool) -> Tuple[tir.PrimFunc, int]:
    if not _measured(func):
        return func, 0
    func, rounded = round_to_float(func)
    narrowed = packed = 0
    if narrow:
        func, narrowed = narrow_directly(func)
    if packs:
        func, packed = narrow_by_packs(func)
    return func, rounded + narrowed + packed


def narrowing(target) -> Tuple[bool, bool]:
    """``(narrow_directly, narrow_by_packs)``: whether :func:`rounding_module` applies each for ``target``.

    Examples
    --------
    Tile targets and AVX-512BW ones (measured on Zen 4: MobileNet-v2 x0.95-0.97 in three runs, the ResNets
    level; docs/benchmarks/dotprod.md, session 58) take both; a tile target without AVX-512BW only the
    direct narrowing.

    >>> narrowing(None), narrowing("llvm -mcpu=core-avx2"), narrowing("llvm -mcpu=znver4")
    ((False, False), (False, False), (True, True))
    """
    if target is None:
        return False, False
    target = tvm.target.Target(target)
    packs = target_has(target, "avx512bw")
    # Every CPU with tiles has AVX-512BW; a target that turned it off keeps the narrowing stores.
    return packs or isa.tile_isa(target) is not None, packs


def rounding_module(mod: tvm.IRModule, target=None) -> tvm.IRModule:
    """:func:`round_to_float` on each product function of ``mod`` whose ISAs are in :data:`MEASURED_ISAS`
    (dot-product steps or tiles), and :func:`narrow_directly` then :func:`narrow_by_packs` too where
    :func:`narrowing` says so for ``target`` (the module itself when nothing changes).

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
    narrow, packs = narrowing(target)
    return pipeline.rewrite_functions(mod, lambda func: _rewrite(func, narrow, packs), logger,
                                      "rewrote %d roundings (llvm.nearbyint, direct or packed 8-bit narrowing)")
