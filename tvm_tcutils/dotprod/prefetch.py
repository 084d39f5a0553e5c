"""Software prefetch of the dot-product kernels' weights: the next block's lines while this block computes.

A conv kernel's parallel loop walks output-channel blocks, each over several rows that reuse the same
weight block (ResNet-50's 7x7 layers: an output-channel pair's 16-147 KB for 7 rows). Run cold, as in a
whole network where every other kernel has passed through the caches since, the block's first row has
to bring the whole block in: 16 KB for a row that computes in 0.5 us, more than one core's share of the
L3 bandwidth, and the hardware prefetcher only follows the stream it sees. Measured in the network
(TVM's profiler, every kernel in turn, Zen 4): ResNet-50's 7x7 stage 5-28 % above its time run hot,
its 14x14 stage 3-9 %.

:func:`prefetch_module` gives such a loop ``llvm.prefetch`` calls, spread over the iterations that share
a block, for the lines of the next block: each row prefetches ``1 / rows`` of it, a few lines per
iteration of the reduction. Nothing is stored or reordered, so results are unchanged; the addresses are
clamped to the weight buffer. It runs inside ``target.build.llvm`` before :mod:`.pipeline`, which carries
the hints along with the product steps it unrolls (:mod:`.hooks`), and changes a parallel loop only when

* the loop's body calls a dot-product intrinsic of an ISA in :data:`MEASURED_ISAS`, every call reading
  one weight buffer of at least :data:`MIN_BYTES`,
* the weight range each iteration reads is, provably, block ``p // rows`` of a constant size and stride
  with ``rows >= 2`` (the reuse a prefetch can hide a fetch behind).
"""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Tuple

from .._tvm import tvm
from tvm import tir
from tvm.tir import stmt_functor

from . import pipeline

logger = logging.getLogger("tvm_tcutils.dotprod.prefetch")

#: Cache-line bytes.
LINE = 64

#: Smallest weight buffer that gets prefetches. ResNet-50's stage 2 (64-147 KB per kernel) gained
#: nothing measurable, its stages 3 and 4 (256 KB - 2.3 MB) 3-5 % and 7-10 % of their time; the
#: MobileNet-v2 kernels under it are untouched.
MIN_BYTES = 192 * 1024

#: ISAs whose kernels were measured faster with the prefetches: AVX-512 VNNI on Zen 4, and AVX2 (the
#: same Zen 4 running ``-mcpu=core-avx2`` code: ResNet-50 x1.017, x1.020, x1.021 [1.014, 1.029] end to end
#: in three runs, its 7x7 kernels x1.06). SSE, the reduce-range AVX2 step and HVX are left as they are
#: until measured.
MEASURED_ISAS = frozenset({"x86_vnni", "x86_avx2"})



def _weight_load(call: tir.Call) -> Optional[tir.BufferLoad]:
    """The vector load of ``call``'s weight operand: its one operand read through a contiguous ramp."""
    loads = []
    for arg in call.args[2:]:
        while isinstance(arg, tir.Call) and arg.op.same_as(tvm.ir.Op.get("tir.reinterpret")):
            arg = arg.args[0]
        if isinstance(arg, tir.BufferLoad) and len(arg.indices) == 1 and isinstance(arg.indices[0], tir.Ramp) \
                and isinstance(arg.indices[0].stride, tir.IntImm) and arg.indices[0].stride.value == 1:
            loads.append(arg)
    return loads[0] if len(loads) == 1 else None


def _substituted(exprs: List[tir.PrimExpr], mapping: dict) -> List[tir.PrimExpr]:
    """``exprs`` with ``mapping`` substituted, in one call (each call converts the whole mapping)."""
    if not mapping or not exprs:
        return list(exprs)
    return list(stmt_functor.substitute(tir.Call("handle", "tir.tvm_tuple", exprs), mapping).args)


def _arithmetic(exprs: List[tir.PrimExpr]) -> List[tir.PrimExpr]:
    """``exprs`` with the shifts and masks TVM's lowering makes of power-of-two divisions turned back into
    ``floordiv`` / ``floormod``, which the arithmetic analyzer reasons about."""
    shift, mask = tvm.ir.Op.get("tir.shift_right"), tvm.ir.Op.get("tir.bitwise_and")

    def post(call):
        amount = call.args[1] if len(call.args) == 2 else None
        if not isinstance(amount, tir.IntImm):
            return None
        if call.op.same_as(shift):
            return tir.floordiv(call.args[0], tir.IntImm(amount.dtype, 1 << amount.value))
        if call.op.same_as(mask) and amount.value > 0 and amount.value & (amount.value + 1) == 0:
            return tir.floormod(call.args[0], tir.IntImm(amount.dtype, amount.value + 1))
        return None
    tupled = stmt_functor.ir_transform(tir.Evaluate(tir.Call("handle", "tir.tvm_tuple", exprs)), None, post,
                                       ["tir.Call"])
    return list(tupled.value.args)


def _let_values(stmt: tir.Stmt) -> dict:
    """Each let-bound variable under ``stmt`` with its value in terms of no other let-bound variable."""
    lets: dict = {}

    def visit(node):
        lets[node.var] = node.value
    stmt_functor.ir_transform(stmt, visit, None, ["tir.LetStmt"])
    variables = list(lets)
    values = [lets[var] for var in variables]
    for _ in range(len(variables)):  # a let's value may use lets defined before it: a chain at most that deep
        new = _substituted(values, dict(zip(variables, values)))
        if all(a.same_as(b) for a, b in zip(new, values)):
            break
        values = new
    return dict(zip(variables, values))


def _children(stmt: tir.Stmt) -> List[tir.Stmt]:
    if isinstance(stmt, tir.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, (tir.LetStmt, tir.Allocate, tir.AttrStmt, tir.DeclBuffer)):
        return [stmt.body]
    if isinstance(stmt, tir.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    return []


def _first_loop(stmt: tir.Stmt) -> Optional[tir.For]:
    """The first loop under ``stmt`` (pre-order, not inside another loop) that calls a dot product."""
    if isinstance(stmt, tir.For):
        return stmt if pipeline.dot_calls(stmt) else None
    for child in _children(stmt):
        found = _first_loop(child)
        if found is not None:
            return found
    return None


def _blocks(loop: tir.For, loads: List[tir.BufferLoad]) -> Optional[Tuple[int, int, int, int]]:
    """(first, size, stride, rows): iteration ``p`` of ``loop`` reads weight elements ``[first + (p // rows)
    * stride, + size)``, proven for every ``p``; ``None`` when it cannot be shown."""
    domains = {}
    stmt_functor.post_order_visit(loop.body, lambda node: domains.__setitem__(
        node.loop_var, tvm.arith.IntervalSet(node.min, node.min + node.extent - 1))
        if isinstance(node, tir.For) else None)
    analyzer = tvm.arith.Analyzer()
    raw = {}
    for load in loads:
        raw.setdefault(tvm.ir.structural_hash(load.indices[0].base), load.indices[0].base)
    bases = _arithmetic(_substituted(list(raw.values()), _let_values(loop.body)))
    bases = list({tvm.ir.structural_hash(base): base for base in bases}.values())
    lanes = int(loads[0].indices[0].lanes)
    sets = [analyzer.int_set(base, domains) for base in bases]
    low, high = sets[0].min_value, sets[0].max_value
    for bounds in sets[1:]:
        low, high = tir.min(low, bounds.min_value), tir.max(high, bounds.max_value)
    p, n = loop.loop_var, loop.extent.value
    analyzer.bind(p, tvm.ir.Range(0, n))
    low, high = analyzer.simplify(low), analyzer.simplify(high)

    def at(expr, value: int) -> Optional[int]:
        result = analyzer.simplify(stmt_functor.substitute(expr, {p: tir.IntImm(p.dtype, value)}))
        return result.value if isinstance(result, tir.IntImm) else None

    first = at(low, 0)
    rows = next((k for k in range(1, n) if at(low, k) != first), n)
    if first is None or rows < 2 or rows == n or n % rows:
        return None
    stride, last = at(low, rows), at(high, 0)
    if stride is None or last is None:
        return None
    stride, size = stride - first, last + lanes - first
    # Lowered TIR divides with truncdiv, TVM's lowering output with floordiv: the same for p >= 0.
    blocked = any(analyzer.can_prove_equal(low, first + divide(p, rows) * stride)
                  for divide in (tir.truncdiv, tir.floordiv))
    if stride < size or not blocked or not analyzer.can_prove_equal(high - low, size - lanes):
        return None
    return first, size, stride, rows


def _prefetched(loop: tir.For, min_bytes: int) -> Optional[tir.For]:
    """``loop`` with the next weight block's prefetches, or ``None`` when it does not qualify."""
    if loop.kind != tir.ForKind.PARALLEL or not isinstance(loop.extent, tir.IntImm) \
            or not isinstance(loop.min, tir.IntImm) or loop.min.value != 0:
        return None
    calls = pipeline.dot_calls(loop.body)
    if not calls or pipeline.call_isa(calls[0]).name not in MEASURED_ISAS:
        return None
    first_load = _weight_load(calls[0])
    weights = first_load.buffer if first_load is not None else None
    if weights is None or len(weights.shape) != 1 or not isinstance(weights.shape[0], tir.IntImm):
        return None
    element = tvm.DataType(weights.dtype).bits // 8
    if weights.shape[0].value * element < min_bytes:
        return None
    loads = [_weight_load(call) for call in calls]
    if any(load is None or not load.buffer.data.same_as(weights.data) for load in loads):
        return None
    blocks = _blocks(loop, loads)
    if blocks is None:
        return None
    first, size, stride, rows = blocks
    lines = math.ceil(size * element / LINE)
    # The loops that carry the prefetches: down the loop nest that calls the products while there are
    # still lines for every iteration (one or two per iteration of a 1x1 conv's reduction).
    chain: List[tir.For] = []
    slots, node = rows, loop.body
    while True:
        inner = _first_loop(node)
        if inner is None or not isinstance(inner.extent, tir.IntImm) or not isinstance(inner.min, tir.IntImm) \
                or (chain and slots * inner.extent.value > lines):
            break
        chain.append(inner)
        slots *= inner.extent.value
        node = inner.body
    if not chain:
        return None
    per_slot = math.ceil(lines / slots)
    p, dtype = loop.loop_var, loop.loop_var.dtype
    slot = tir.truncmod(p, rows)
    for inner in chain:
        slot = slot * inner.extent.value + (inner.loop_var - inner.min)
    flat = tir.decl_buffer(weights.shape, weights.dtype, name=weights.name + "_prefetched", data=weights.data)
    last = tir.IntImm(dtype, weights.shape[0].value - 1)
    steps = LINE // element
    prefetches = []
    for k in range(per_slot):
        address = first + (tir.truncdiv(p, rows) + 1) * stride + (slot * per_slot + k) * steps
        prefetches.append(tir.Evaluate(pipeline.prefetch_call(tir.BufferLoad(flat, [tir.Min(address, last)]))))
    target = chain[-1]
    carrier = tir.For(target.loop_var, target.min, target.extent, target.kind,
                      tir.SeqStmt(prefetches + [target.body]), target.thread_binding, target.annotations)
    body = stmt_functor.ir_transform(loop.body, None, lambda node: carrier if node.same_as(target) else None,
                                     ["tir.For"])
    return tir.For(p, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations)


def prefetch_weights(func: tir.PrimFunc, min_bytes: Optional[int] = None) -> Tuple[tir.PrimFunc, int]:
    """``func`` with its dot-product parallel loops prefetching their next weight block, and how many
    loops changed (``min_bytes``: the smallest weight buffer to prefetch, :data:`MIN_BYTES` by default).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((4,), name="x"); y = te.compute((4,), lambda i: x[i] + 1.0, name="y")
    >>> func = tvm.lower(te.create_schedule(y.op), [x, y])["main"]
    >>> prefetch_weights(func)[1]  # a float kernel: no weight block to prefetch
    0
    """
    changed = [0]
    min_bytes = MIN_BYTES if min_bytes is None else min_bytes

    def post(node):
        new = _prefetched(node, min_bytes)
        changed[0] += new is not None
        return new

    body = stmt_functor.ir_transform(func.body, None, post, ["tir.For"])
    return (func.with_body(body) if changed[0] else func), changed[0]


def prefetch_module(mod: tvm.IRModule, min_bytes: Optional[int] = None) -> tvm.IRModule:
    """:func:`prefetch_weights` on each function of ``mod`` (the module itself when nothing changes).

    Examples
    --------
    Without a dot-product loop nothing qualifies, whatever the size threshold:

    >>> import tvm
    >>> from tvm import te
    >>> w = te.placeholder((1 << 20,), "int8", name="w")
    >>> y = te.compute((1 << 20,), lambda i: w[i].astype("int32") * 3, name="y")
    >>> mod = tvm.lower(te.create_schedule(y.op), [w, y])
    >>> prefetch_module(mod, min_bytes=0).same_as(mod)
    True
    """
    return pipeline.rewrite_functions(mod, lambda func: prefetch_weights(func, min_bytes), logger,
                                      "prefetching the next weight block in %d dot-product loops")
