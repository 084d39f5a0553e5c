"""An AMX conv's epilogue step by step inside its tile program, while each step's outputs are in L1.

The tile conv (:mod:`.topi.conv2d_amx`) runs a task's whole tile program -- strips of channels, steps of
pixels, each step ending in its accumulators' tile stores -- and then the elementwise epilogue fused after
it (requantize, a QDQ residual add) over the task's int32 buffer. A 1x1 conv of 224-pixel tasks keeps 57 KB
of int32 there, more than L1 holds, so the epilogue reads back from L2 what the tiles just stored, and the
tile engine and the vector units never work side by side. Measured on a C replica of ResNet-50's 56 x 56
residual conv (``scripts/probe_amx_epilogue.py``, Emerald Rapids): each step's epilogue right after its
stores takes x0.80 of the kernel's time; a tile program per step instead (its own tile configuration) was
x1.27 slower. Tasks whose outputs fit L1 (one row of a 3x3 conv, stacked 7 x 7 rows, the stem's rows) gain
from the overlap alone: ResNet-18, whose convs are nearly all of those, x0.94 of the whole-program form
(``scripts/probe_epilogue_forms.py``).

The schedule orders the epilogue's loops as the tile program's (strip, step, then the step's pixels and
channels) and the program marks each step's stores with its strip and step
(:data:`~.topi.tiles.STEP_STRIP`, :data:`~.topi.tiles.STEP_INDEX`). :func:`interleave` then moves the
epilogue's iteration ``(strip, step)`` to right after that step's stores and drops the epilogue loop: the
same statements on the same values (each reads only what its step stored), in another order. It runs in
``target.build.llvm`` (:mod:`.hooks`) on the final TIR and leaves every function it does not recognise as
it was: markers without an epilogue nest of the matching extents stay as they are (the code generator
ignores them).

Once the epilogue sits in the steps, :func:`bias_into_tiles` has each step's accumulators start from the
int32 bias the epilogue added (a tile load of one 64-byte row, stride 0) instead of zero, so the epilogue
-- bound by the vector ports, 9-16 instructions per 16 outputs -- loses one: on a C loop of ResNet-50's
residual epilogue (Emerald Rapids) 7.5 -> 6.9 cycles per 16 outputs, the plain requantize 3.7 -> 3.1.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._tvm import tvm
from tvm import tir
from tvm.tir import stmt_functor

from . import pipeline
from .isa.x86_amx import LOAD, STORE, ZERO
from .topi.tiles import STEP_INDEX, STEP_STRIP

logger = logging.getLogger("tvm_tcutils.dotprod.tile_epilogue")


def _marked(stmt: tir.Stmt) -> List[tir.AttrStmt]:
    found: List[tir.AttrStmt] = []
    stmt_functor.post_order_visit(
        stmt, lambda node: found.append(node) if isinstance(node, tir.AttrStmt) and node.attr_key == STEP_STRIP
        else None)
    return found


def _program_steps(stmt: tir.Stmt) -> Optional[Tuple[int, int]]:
    """``(strips, steps)`` a tile program's marked stores cover -- every step of every strip once, the
    whole steps in a loop and a tail step after them (a loop of one iteration is gone from the TIR: its
    marker holds 0) -- or None."""
    marks = _marked(stmt)
    if not marks or not all(isinstance(m.body, tir.AttrStmt) and m.body.attr_key == STEP_INDEX for m in marks):
        return None
    loops = {}
    stmt_functor.post_order_visit(stmt, lambda node: loops.setdefault(node.loop_var, node)
                                  if isinstance(node, tir.For) else None)

    def covered(value) -> Optional[range]:
        if isinstance(value, tir.IntImm):
            return range(value.value, value.value + 1)
        loop = loops.get(value) if isinstance(value, tir.Var) else None
        if loop is None or not isinstance(loop.extent, tir.IntImm) or not isinstance(loop.min, tir.IntImm) \
                or int(loop.min) != 0:
            return None
        return range(int(loop.extent))

    strips = {str(m.value) for m in marks}
    strip_range = covered(marks[0].value)
    steps: List[int] = []
    for mark in marks:
        step_range = covered(mark.body.value)
        if step_range is None:
            return None
        steps += list(step_range)
    if strip_range is None or len(strips) != 1 or sorted(steps) != list(range(len(steps))) or strip_range.start:
        return None
    return len(strip_range), len(steps)


def _epilogue_share(stmt: tir.Stmt, extents: Sequence[int]):
    """``(share, [loop variables])``: ``stmt`` as serial loops from 0 of ``extents`` around one step's
    share of the epilogue, else None."""
    variables = []
    for extent in extents:
        if not (isinstance(stmt, tir.For) and stmt.kind == tir.ForKind.SERIAL and isinstance(stmt.min, tir.IntImm)
                and isinstance(stmt.extent, tir.IntImm) and (int(stmt.min), int(stmt.extent)) == (0, extent)):
            return None
        variables.append(stmt.loop_var)
        stmt = stmt.body
    return stmt, variables


def _interleave_seq(seq: tir.SeqStmt) -> Optional[tir.SeqStmt]:
    """The sequence with its epilogue nest moved into the tile program before it, or None."""
    parts = list(seq.seq)
    marked = [k for k, part in enumerate(parts) if _marked(part)]
    if not marked:
        return None
    first = marked[0]  # the program: its whole steps, then (a second configuration) its tail
    for j in range(marked[-1] + 1, len(parts)):
        program = _program_steps(parts[first] if j == first + 1 else tir.SeqStmt(parts[first:j]))
        if program is None or program == (1, 1):  # not one program's steps, or one step: nothing to move
            return None
        iterating = [n > 1 for n in program]  # the epilogue has a loop where the program iterates
        found = _epilogue_share(parts[j], [n for n in program if n > 1])
        if found is None:
            continue
        share, variables = found

        def post(node):
            if not (isinstance(node, tir.AttrStmt) and node.attr_key == STEP_STRIP
                    and isinstance(node.body, tir.AttrStmt) and node.body.attr_key == STEP_INDEX):
                return None
            values = [v for v, loop in zip((node.value, node.body.value), iterating) if loop]
            return tir.SeqStmt([node.body.body, tir.stmt_functor.substitute(share, dict(zip(variables, values)))])

        moved = [stmt_functor.ir_transform(part, None, post, ["tir.AttrStmt"]) for part in parts[first:j]]
        return tir.SeqStmt(parts[:first] + moved + parts[j + 1:])
    return None


def interleave(func: tir.PrimFunc) -> Tuple[tir.PrimFunc, int]:
    """``(func, count)``: each marked tile program of ``func`` with its epilogue moved in, step by step.

    Examples
    --------
    A function without marked tile stores is left alone:

    >>> x = tvm.tir.decl_buffer((4,), "float32", name="x")
    >>> func = tvm.tir.PrimFunc([x.data], tvm.tir.BufferStore(x, tvm.tir.const(0.0), [0]))
    >>> interleave(func)[1]
    0
    """
    if not _marked(func.body):
        return func, 0
    # A program with a tail step holds two copies of the share: each needs loop variables of its own (ssa).
    return pipeline.rewrite_nodes(func, _interleave_seq, ["tir.SeqStmt"], ssa=True)


def interleave_module(mod: tvm.IRModule) -> tvm.IRModule:
    """:func:`interleave`, then :func:`bias_into_tiles`, on each function of ``mod`` (the module itself
    when nothing changes)."""
    def both(func: tir.PrimFunc) -> Tuple[tir.PrimFunc, int]:
        func, moved = interleave(func)
        func, biased = bias_into_tiles(func)
        return func, moved + biased

    return pipeline.rewrite_functions(mod, both, logger, "moved %d tile epilogues into their programs or biases "
                                      "into their tiles")


# -- a bias as the accumulators' first value -----------------------------------------------------------
#: Most share points :func:`bias_into_tiles` enumerates to map a step's tiles onto the share's reads.
MAX_SHARE_POINTS = 1 << 16


def _tile_call(node, name: str) -> Optional[tir.Call]:
    """The tile intrinsic call ``name`` that ``node`` is (a call) or evaluates (a statement), else None."""
    call = node.value if isinstance(node, tir.Evaluate) else node
    return call if isinstance(call, tir.Call) and pipeline.intrinsic_name(call) == name else None


def _biased_load(add: tir.PrimExpr, product: Optional[tir.Var] = None):
    """``(product load, bias load)`` of ``add`` = an int32 vector load plus another buffer's (either
    order), both of contiguous lanes, the first from ``product``'s data when given; else None."""
    if not isinstance(add, tir.Add):
        return None
    for a, b in ((add.a, add.b), (add.b, add.a)):
        if not (isinstance(a, tir.BufferLoad) and isinstance(b, tir.BufferLoad)) \
                or a.buffer.data.same_as(b.buffer.data):
            continue
        if product is not None and not a.buffer.data.same_as(product):
            continue
        ramps = [x.indices[-1] for x in (a, b)] if len(a.indices) == len(b.indices) == 1 else []
        if a.dtype == b.dtype and tvm.DataType(a.dtype).type_code == tvm.DataTypeCode.INT \
                and tvm.DataType(a.dtype).bits == 32 and len(ramps) == 2 \
                and all(isinstance(r, tir.Ramp) and isinstance(r.stride, tir.IntImm) and r.stride.value == 1
                        for r in ramps):
            return a, b
    return None


class _Expander:
    """Let-bound variables of a function replaced by their values, recursively."""

    def __init__(self, func: tir.PrimFunc):
        self.lets: Dict[tir.Var, tir.PrimExpr] = {}
        stmt_functor.post_order_visit(
            func.body, lambda n: self.lets.__setitem__(n.var, n.value) if isinstance(n, tir.LetStmt) else None)
        self.analyzer = tvm.arith.Analyzer()

    def __call__(self, expr: tir.PrimExpr) -> tir.PrimExpr:
        for _ in range(32):
            used = set()
            stmt_functor.post_order_visit(expr, lambda n: used.add(n) if isinstance(n, tir.Var) and n in self.lets
                                          else None)
            if not used:
                return self.analyzer.simplify(expr)
            expr = stmt_functor.substitute(expr, {v: self.lets[v] for v in used})
        return self.analyzer.simplify(expr)


def _share_reads(stmt: tir.Stmt, product: tir.Var):
    """``[(product load, bias load, [(loop var, extent)])]``: the biased reads of ``product`` under
    ``stmt`` with the serial loops around each, and the number of ``product`` loads under ``stmt``."""
    reads = []

    def expr_visit(expr, loops):
        def post(node):
            found = _biased_load(node, product) if isinstance(node, tir.Add) else None
            if found is not None:
                reads.append((*found, list(loops)))
        stmt_functor.post_order_visit(expr, post)

    def walk(node, loops):
        if isinstance(node, tir.For):
            extent = node.extent if isinstance(node.extent, tir.IntImm) and isinstance(node.min, tir.IntImm) \
                and int(node.min) == 0 else None
            walk(node.body, loops + [(node.loop_var, None if extent is None else int(extent))])
        elif isinstance(node, tir.SeqStmt):
            for part in node.seq:
                walk(part, loops)
        elif isinstance(node, (tir.LetStmt, tir.AttrStmt)):
            expr_visit(node.value, loops)
            walk(node.body, loops)
        elif isinstance(node, tir.IfThenElse):
            expr_visit(node.condition, loops)
            walk(node.then_case, loops)
            if node.else_case is not None:
                walk(node.else_case, loops)
        elif isinstance(node, tir.BufferStore):
            expr_visit(node.value, loops)
            for index in node.indices:
                expr_visit(index, loops)
        elif isinstance(node, tir.Evaluate):
            expr_visit(node.value, loops)
        # anything else (allocations, asserts): reads under it are not mapped, and so not among reads

    walk(stmt, [])
    return reads, _product_loads(stmt, product)


def _stored_at(store: tir.Call) -> Optional[Tuple[tir.Var, tir.PrimExpr]]:
    """``(buffer data, element index)`` a tile store writes from: ``address_of(buf[i])`` (final TIR) or
    ``tvm_access_ptr`` (lowered TIR)."""
    pointer = store.args[3]
    if not isinstance(pointer, tir.Call):
        return None
    if pointer.op.same_as(tvm.ir.Op.get("tir.address_of")) and isinstance(pointer.args[0], tir.BufferLoad) \
            and len(pointer.args[0].indices) == 1:
        return pointer.args[0].buffer.data, pointer.args[0].indices[0]
    if pointer.op.same_as(tvm.ir.Op.get("tir.tvm_access_ptr")) and isinstance(pointer.args[1], tir.Var):
        return pointer.args[1], pointer.args[2]
    return None


def _tile_bias(expand: _Expander, store: tir.Call, reads, lanes: int) -> Optional[tir.PrimExpr]:
    """The bias index of column 0 of the tile ``store`` writes, read by ``reads`` at one bias index for
    every row (the tile's columns ``lanes`` wide, a share's vector covering a whole tile row), else None."""
    stride, target = store.args[4], _stored_at(store)
    if target is None or not isinstance(stride, tir.IntImm) or stride.value % 4:
        return None
    base, pitch = expand(target[1]), stride.value // 4
    found = None
    for product, bias, loops in reads:
        if product.indices[-1].lanes != lanes or any(extent is None for _, extent in loops):
            return None
        variables = [v for v, _ in loops]
        offset = [expand.analyzer.simplify(c) for c in
                  tvm.arith.detect_linear_equation(expand(product.indices[-1].base) - base, variables)]
        index = [expand.analyzer.simplify(c) for c in
                 tvm.arith.detect_linear_equation(expand(bias.indices[-1].base), variables)]
        if not offset or not index or not all(isinstance(c, tir.IntImm) for c in list(offset) + list(index[:-1])):
            return None
        extents = [extent for _, extent in loops]
        if int(np.prod(extents, dtype=np.int64)) > MAX_SHARE_POINTS:
            return None
        grid = np.indices(extents, dtype=np.int64).reshape(len(extents), -1) if extents \
            else np.zeros((0, 1), np.int64)
        d = np.dot([int(c) for c in offset[:-1]], grid) + int(offset[-1]) if extents \
            else np.full(1, int(offset[-1]), np.int64)
        in_band = (d >= 0) & (d % pitch < lanes)
        if np.any(d[in_band] % pitch != 0):
            return None  # a vector not starting at a tile row: its lanes are not the tile's columns
        if not np.any(in_band):
            continue
        points = grid[:, in_band]
        channel = np.dot([int(c) for c in index[:-1]], points) if extents else np.zeros(1, np.int64)
        if np.any(channel != channel[0]):
            return None  # rows of the band read other biases
        at = {v: tir.const(int(p), v.dtype) for v, p in zip(variables, points[:, 0])}
        value = expand(bias.indices[-1].base)
        value = expand(stmt_functor.substitute(value, at)) if at else value
        if found is not None:
            diff = expand(value - found)
            if not (isinstance(diff, tir.IntImm) and diff.value == 0):
                return None
        found = value
    return found


def _step_plan(seq: tir.SeqStmt, expand: _Expander, lanes: int):
    """``(product data, bias buffer, {tile: bias index}, product loads covered)`` of a step -- a sequence
    that zeroes accumulator tiles, then stores each once to one int32 buffer whose every read after them
    adds one bias vector per tile row -- else None."""
    parts = list(seq.seq)
    zeroed = {}
    for k, part in enumerate(parts):
        call = _tile_call(part, ZERO)
        if call is not None:
            zeroed[int(call.args[2])] = k
    if not zeroed:
        return None
    rest = tir.SeqStmt(parts[max(zeroed.values()) + 1:]) if max(zeroed.values()) + 1 < len(parts) else None
    if rest is None:
        return None
    stores: Dict[int, List[tir.Call]] = {}
    stmt_functor.post_order_visit(rest, lambda n: stores.setdefault(int(n.args[2]), []).append(n)
                                  if isinstance(n, tir.Call) and _tile_call(n, STORE) is not None else None)
    if sorted(stores) != sorted(zeroed) or any(len(calls) != 1 for calls in stores.values()):
        return None
    targets = [_stored_at(calls[0]) for calls in stores.values()]
    if any(t is None for t in targets) or not all(t[0].same_as(targets[0][0]) for t in targets):
        return None
    product = targets[0][0]
    reads, loads = _share_reads(rest, product)
    if not reads or loads != len(reads) or len({r[1].buffer.data for r in reads}) != 1:
        return None
    biases = {}
    for t, calls in stores.items():
        index = _tile_bias(expand, calls[0], reads, lanes)
        if index is None:
            return None
        biases[t] = index
    return product, reads[0][1].buffer, biases, loads


def bias_into_tiles(func: tir.PrimFunc, lanes: int = 16) -> Tuple[tir.PrimFunc, int]:
    """``(func, count)``: in each step of a tile program whose epilogue (moved in by :func:`interleave`)
    adds a per-channel int32 bias to the products, the accumulators start from the bias instead of zero.

    A step's tiles are zeroed, summed into and stored; its epilogue then reads each stored int32 and adds
    the bias of its channel, one vector instruction per 16 outputs of an epilogue of 9-16 (the residual
    conv's), which is bound by the vector ports (``scripts/probe_amx_epilogue.py``). ``tileloadd`` with a
    row stride of 0 fills a tile with one 64-byte row, the 16 biases of its columns, so the accumulators
    begin at the bias and the epilogue drops its add: the same int32 sums (two's complement addition in
    another order). ``lanes``: int32 columns of a tile.

    A function changes only where every read of a product buffer is such a biased read mapped onto the
    tiles of its step (linear indices, each tile row at one bias index, vectors whole tile rows); anything
    else -- an epilogue after the program, another reader -- leaves it as it was.

    Examples
    --------
    A function without tile programs is left alone:

    >>> x = tvm.tir.decl_buffer((4,), "float32", name="x")
    >>> bias_into_tiles(tvm.tir.PrimFunc([x.data], tvm.tir.BufferStore(x, tvm.tir.const(0.0), [0])))[1]
    0
    """
    if not _has_tile_zero(func.body):
        return func, 0
    expand = _Expander(func)
    plans: Dict[tir.Var, list] = {}
    stmt_functor.post_order_visit(func.body, lambda n: (lambda plan: plans.setdefault(plan[0], []).append((n, plan))
                                                        if plan is not None else None)(
        _step_plan(n, expand, lanes)) if isinstance(n, tir.SeqStmt) else None)
    if not plans:
        return func, 0
    chosen = {}
    for product, steps in plans.items():
        if sum(plan[3] for _, plan in steps) == _product_loads(func.body, product):
            chosen.update({seq: plan for seq, plan in steps})
    if not chosen:
        return func, 0

    def unbiased(product):
        def post(node):
            found = _biased_load(node, product)
            return found[0] if found is not None else None
        return post

    def pre(node):
        plan = chosen.get(node) if isinstance(node, tir.SeqStmt) else None
        if plan is None:
            return None
        product, bias, biases, _ = plan
        parts = []
        for part in node.seq:
            call = _tile_call(part, ZERO)
            if call is not None:
                pointer = tir.call_intrin("handle", "tir.address_of", tir.BufferLoad(bias, [biases[int(call.args[2])]]))
                parts.append(tir.Evaluate(tir.call_llvm_intrin("int32", LOAD, tir.const(0, "uint32"), call.args[2],
                                                               pointer, tir.const(0, "int64"))))
            else:
                parts.append(stmt_functor.ir_transform(part, None, unbiased(product), ["tir.Add"]))
        return tir.SeqStmt(parts)

    return func.with_body(stmt_functor.ir_transform(func.body, pre, None, ["tir.SeqStmt"])), len(chosen)


def _store_pointer_loads(stmt: tir.Stmt) -> set:
    """Handles of the buffer loads that only name where a tile store writes (``address_of(buf[i])``)."""
    found = set()

    def post(node):
        if isinstance(node, tir.Call) and _tile_call(node, STORE) is not None and isinstance(node.args[3], tir.Call) \
                and node.args[3].args and isinstance(node.args[3].args[0], tir.BufferLoad):
            found.add(node.args[3].args[0].handle.value)
    stmt_functor.post_order_visit(stmt, post)
    return found


def _product_loads(stmt: tir.Stmt, product: tir.Var) -> int:
    """Reads of ``product``'s data under ``stmt`` (tile stores' pointers are not reads)."""
    stored, count = _store_pointer_loads(stmt), [0]
    stmt_functor.post_order_visit(stmt, lambda n: count.__setitem__(0, count[0] + 1)
                                  if isinstance(n, tir.BufferLoad) and n.buffer.data.same_as(product)
                                  and n.handle.value not in stored else None)
    return count[0]


def _has_tile_zero(stmt: tir.Stmt) -> bool:
    found = []
    stmt_functor.post_order_visit(stmt, lambda n: found.append(n) if isinstance(n, tir.Evaluate)
                                  and _tile_call(n, ZERO) is not None else None)
    return bool(found)
