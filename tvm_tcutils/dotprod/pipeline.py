"""Software pipelining of the dot-product kernels' tile loops: the epilogue of one tile among the next tile's products.

The conv2d schedules (:mod:`.topi`; also the depthwise ones) compute a tile of accumulators (a few
vector registers) with the dot-product instruction, then the tile's epilogue: the elementwise ops fused
after the product (bias, requantize, the residual add of a QDQ model, the 8-bit cast and store). (The
dense schedule's tile loop is its parallel loop: nothing to pipeline there.)
Written one after the other, the epilogue's vector instructions (19 per register for a requantized
residual add) wait for the tile's last products and then run on their own: the out-of-order window
(a few dozen vector instructions) is too small to overlap a whole epilogue with the next tile's
products, and LLVM's scheduler keeps the two blocks apart. A 1x1 conv with 64 input channels (16
dot-product steps per register) then took 1.6x its products' time on Zen 4 with the residual add, 1.2x
without it; with the previous tile's epilogue spread among the products, 1.33x and 1.08x (the
instruction mix measured alone: ``scripts/probe_epilogue_overlap.py``).

:func:`pipeline_module` rewrites each loop of the form::

    for t in range(n):            # the tile loop the schedule computes the accumulators at
        acc[...] = 0               # the accumulators' initialization
        <reduction nest>           # stores to acc only, with a dot-product intrinsic
        <epilogue nest>            # reads acc, writes buffers the reduction does not read

into a prologue (tile 0's products), a loop over tiles 1..n-1 whose unrolled body interleaves tile
``t``'s product steps with the epilogue statements of tile ``t - 1`` (read from a second
accumulator block, ``acc_prev``), and the last tile's epilogue. Every statement computes what it
did before and no store moves past a load of the same buffer, so the results are bit-identical
(``python_tests/dotprod/test_pipeline.py``). It runs inside ``target.build.llvm``
(:mod:`.hooks`), on the final TIR of each function, and leaves every loop it does not recognise as
it was: float kernels never contain the dot-product intrinsics it looks for.
"""
from __future__ import annotations

import functools
import itertools
import logging
from typing import Callable, Dict, List, Optional, Tuple

from .._tvm import tvm
from tvm import tir
from tvm.tir import stmt_functor

from .isa import ISAS, RANGE_ISAS, TILE_ISAS
from .isa.x86_amx import LOAD, STORE, ZERO

logger = logging.getLogger("tvm_tcutils.dotprod.pipeline")

#: The ISA of each dot-product instruction's LLVM intrinsic: a reduction nest must use one of them.
DOT_INTRINSICS = {v.intrinsic: isa for isa in ISAS + RANGE_ISAS for v in isa.variants if v.intrinsic}

#: The tile engines' product intrinsics (:data:`~.isa.TILE_ISAS`): calls with effects, so not pipelined.
TILE_INTRINSICS = {v.intrinsic: isa for isa in TILE_ISAS for v in isa.variants}

#: The float intrinsics of the kernels' epilogues that :func:`.rounding.float_bounds` reads through.
EPILOGUE_INTRINSICS = frozenset({"llvm.nearbyint", "llvm.fmuladd", "llvm.fma"})

#: Unrolled product steps (statements of the reduction nest) a pipelined loop may have: the 1x1 convs
#: with up to 256 input channels. Past it the epilogue is a small share of the tile's time (a 3x3 conv
#: with 64 channels has 144 steps); measured on ResNet-50, unrolling up to 600 steps made it 10 % slower
#: and peeling longer reductions' first iterations (to take the epilogue) 1 % slower.
MAX_STEPS = 64

#: Share of the ISA's vector registers the two accumulator blocks (this tile's, the previous one's) may
#: take: the rest holds operands and the epilogue's constants. AVX-512's 8-register tiles qualify (16 of
#: 32); AVX2's 7-8 register tiles do not (16 ymm registers: pipelined, they spilled and ran up to 1.9x
#: slower).
REGISTER_SHARE = 0.5

#: Statement kinds an unrolled step or epilogue statement may contain (no allocations, calls with
#: effects, or nested parallel loops).
_PLAIN = (tir.BufferStore, tir.LetStmt, tir.SeqStmt, tir.IfThenElse, tir.For)


def _flatten(stmt: tir.Stmt) -> List[tir.Stmt]:
    if isinstance(stmt, tir.SeqStmt):
        return [part for s in stmt.seq for part in _flatten(s)]
    return [stmt]


def _zero_init(stmt: tir.Stmt) -> bool:
    value = stmt.value if isinstance(stmt, tir.BufferStore) else None
    return isinstance(value, tir.Broadcast) and isinstance(value.value, tir.IntImm) and value.value.value == 0


def _visit(stmt: tir.Stmt, kind) -> list:
    found: list = []
    stmt_functor.post_order_visit(stmt, lambda node: found.append(node) if isinstance(node, kind) else None)
    return found


@functools.lru_cache(maxsize=None)
def _intrinsic_ids() -> Dict[int, str]:
    """LLVM's id of each of :data:`DOT_INTRINSICS`, :data:`TILE_INTRINSICS`, the tile loads, stores and
    zeroing, and :data:`EPILOGUE_INTRINSICS` (what lowered TIR calls hold), looked up once."""
    names = {**DOT_INTRINSICS, **TILE_INTRINSICS}.keys() | {LOAD, STORE, ZERO} | EPILOGUE_INTRINSICS
    return {tvm.target.codegen.llvm_lookup_intrinsic_id(name): name for name in names}


def intrinsic_name(call: tir.Call) -> str:
    """The LLVM intrinsic ``call`` (a ``tir.call_llvm_pure_intrin`` or ``call_llvm_intrin``) calls, by name
    or by lowered id (those of :func:`_intrinsic_ids` only)."""
    name = call.args[0] if call.args else None
    if isinstance(name, tir.StringImm):
        return name.value
    if isinstance(name, tir.IntImm):
        return _intrinsic_ids().get(name.value, "")
    return ""


def dot_calls(stmt: tir.Stmt) -> List[tir.Call]:
    """The calls of a dot-product intrinsic (:data:`DOT_INTRINSICS`) under ``stmt``, in visiting order."""
    pure = tvm.ir.Op.get("tir.call_llvm_pure_intrin")
    found: List[tir.Call] = []

    def post(call):
        if call.op.same_as(pure) and intrinsic_name(call) in DOT_INTRINSICS:
            found.append(call)
    # ir_transform calls back for Call nodes only (post_order_visit would for every node: slow on the
    # unrolled bodies of pipelined kernels).
    stmt_functor.ir_transform(stmt, None, post, ["tir.Call"])
    return found


def call_isa(call: tir.Call):
    """The ISA whose dot-product intrinsic ``call`` (one of :func:`dot_calls`) calls."""
    return DOT_INTRINSICS[intrinsic_name(call)]


def product_isas(stmt: tir.Stmt) -> frozenset:
    """Names of the ISAs whose product instructions ``stmt`` calls: dot-product steps and tile products.

    Examples
    --------
    >>> product_isas(tir.Evaluate(0))
    frozenset()
    """
    effects = tvm.ir.Op.get("tir.call_llvm_intrin")
    names = {call_isa(call).name for call in dot_calls(stmt)}

    def post(call):
        if call.op.same_as(effects) and intrinsic_name(call) in TILE_INTRINSICS:
            names.add(TILE_INTRINSICS[intrinsic_name(call)].name)
    stmt_functor.ir_transform(stmt, None, post, ["tir.Call"])
    return frozenset(names)


def _dot_isa(stmt: tir.Stmt):
    """The ISA of the dot-product intrinsic ``stmt`` calls, or ``None``."""
    names = {intrinsic_name(call) for call in dot_calls(stmt)}
    return next((DOT_INTRINSICS[name] for name in sorted(names)), None)


def is_hint(stmt: tir.Stmt) -> bool:
    """Whether ``stmt`` only evaluates an ``llvm.prefetch`` call (:mod:`.prefetch` puts them in the
    reduction nests): no effect on any value, so it may move with the product steps."""
    if not isinstance(stmt, tir.Evaluate) or not isinstance(stmt.value, tir.Call) \
            or not stmt.value.op.same_as(tvm.ir.Op.get("tir.call_llvm_intrin")):
        return False
    return stmt.value.args[0].value == prefetch_intrinsic_id() if isinstance(stmt.value.args[0], tir.IntImm) \
        else getattr(stmt.value.args[0], "value", None) == "llvm.prefetch"


@functools.lru_cache(maxsize=None)
def prefetch_intrinsic_id() -> int:
    """LLVM's id of ``llvm.prefetch`` (what lowered TIR calls hold), looked up once."""
    return tvm.target.codegen.llvm_lookup_intrinsic_id("llvm.prefetch")


#: ``llvm.prefetch``'s arguments after the address: read, keep in every cache level (``prefetcht0``),
#: data cache.
PREFETCH_TO_L1 = (0, 3, 1)


def prefetch_call(element: tir.BufferLoad) -> tir.Call:
    """A call of ``llvm.prefetch`` (:data:`PREFETCH_TO_L1`) for the line holding ``element``."""
    return tir.call_llvm_intrin("int32", prefetch_intrinsic_id(), tir.const(len(PREFETCH_TO_L1) + 1, "uint32"),
                                tir.address_of(element), *[tir.const(value, "int32") for value in PREFETCH_TO_L1])


def _plain(stmt: tir.Stmt) -> bool:
    bad: list = []

    def visit(node):
        if isinstance(node, tir.Evaluate) and is_hint(node):
            return
        if isinstance(node, tir.Stmt) and not isinstance(node, _PLAIN):
            bad.append(node)
        elif isinstance(node, tir.For) and node.kind not in (tir.ForKind.SERIAL, tir.ForKind.UNROLLED,
                                                            tir.ForKind.VECTORIZED):
            bad.append(node)
    stmt_functor.post_order_visit(stmt, visit)
    return not bad


def _vector_stores(stores: List[tir.BufferStore]) -> bool:
    """Whether every one of an epilogue's ``stores`` writes a vector: an epilogue TVM could not vectorize
    (a loop of scalar statements per register) measured slower pipelined than as it was."""
    return all(tvm.DataType(s.value.dtype).lanes > 1 for s in stores)


def _copies(stores: List[tir.BufferStore], acc: tir.Var) -> bool:
    """Whether every one of an epilogue's ``stores`` writes an accumulator as it is (an int32 output):
    nothing to overlap, and unrolling the products only raised register pressure (MobileNet-v2's int32
    convs ran 2x slower pipelined)."""
    def plain(value) -> bool:
        while isinstance(value, tir.Cast):
            value = value.value
        return isinstance(value, tir.BufferLoad) and value.buffer.data.same_as(acc)
    return all(plain(s.value) for s in stores)


def _unrolled(stmt: tir.Stmt, limit: int) -> Optional[List[tir.Stmt]]:
    """The statements of a constant serial loop nest with its loop variables substituted, outermost
    first; ``None`` past ``limit`` statements (prefetch hints not counted) or for another loop kind.
    A loop body that starts with prefetch hints unrolls into the hints and then its last statement's."""
    if isinstance(stmt, tir.SeqStmt) and len(stmt.seq) > 1 and all(is_hint(s) for s in list(stmt.seq)[:-1]):
        inner = _unrolled(stmt.seq[len(stmt.seq) - 1], limit)
        return None if inner is None else list(stmt.seq)[:-1] + inner
    if not isinstance(stmt, tir.For):
        return [stmt]
    if stmt.kind not in (tir.ForKind.SERIAL, tir.ForKind.UNROLLED) or not isinstance(stmt.extent, tir.IntImm) \
            or not isinstance(stmt.min, tir.IntImm):
        return None
    inner = _unrolled(stmt.body, limit)
    if inner is None or sum(not is_hint(s) for s in inner) * stmt.extent.value > limit:
        return None
    return [stmt_functor.substitute(s, {stmt.loop_var: tir.IntImm(stmt.loop_var.dtype, value)})
            for value in range(stmt.min.value, stmt.min.value + stmt.extent.value) for s in inner]


def _reading(stmt: tir.Stmt, old: tir.Var, buffer: tir.Buffer) -> tir.Stmt:
    """``stmt`` with its loads of buffer variable ``old`` reading ``buffer`` instead."""
    def post(node):
        if node.buffer.data.same_as(old):
            return tir.BufferLoad(buffer, node.indices)
        return None
    return stmt_functor.ir_transform(stmt, None, post, ["tir.BufferLoad"])


def _pipelined(loop: tir.For, max_steps: int) -> Optional[tir.Stmt]:
    """The pipelined form of ``loop`` (see the module docstring), or ``None`` when it is not a tile loop."""
    if loop.kind != tir.ForKind.SERIAL or not isinstance(loop.extent, tir.IntImm) or loop.extent.value < 2:
        return None
    body = _flatten(loop.body)
    hints = list(itertools.takewhile(is_hint, body))  # prefetches at the tile's start stay there
    body = body[len(hints):]
    count = next((k for k, s in enumerate(body) if not _zero_init(s)), len(body))
    inits, rest = body[:count], body[count:]
    if not inits or len(rest) < 2:
        return None
    acc = inits[0].buffer
    if any(not s.buffer.data.same_as(acc.data) for s in inits) or len(acc.shape) != 1 \
            or not isinstance(acc.shape[0], tir.IntImm):
        return None
    elements = acc.shape[0].value
    reduction, epilogue = rest[0], tir.SeqStmt(rest[1:]) if len(rest) > 2 else rest[1]
    isa = _dot_isa(reduction)
    if isa is None or any(not s.buffer.data.same_as(acc.data) for s in _visit(reduction, tir.BufferStore)):
        return None
    accumulator_bits = elements * tvm.DataType(acc.dtype).bits * tvm.DataType(acc.dtype).lanes
    if 2 * accumulator_bits > REGISTER_SHARE * isa.registers * isa.lanes * 32:
        return None
    epilogue_stores = _visit(epilogue, tir.BufferStore)
    written = [s.buffer.data for s in epilogue_stores]
    read = [node.buffer.data for node in _visit(reduction, tir.BufferLoad)]
    if any(var.same_as(acc.data) for var in written) or any(w.same_as(r) for w in written for r in read):
        return None
    if not _plain(reduction) or not _plain(epilogue):
        return None
    steps, epilogues = _unrolled(reduction, max_steps), _unrolled(epilogue, elements)
    if steps is None or epilogues is None or not _vector_stores(epilogue_stores) \
            or _copies(epilogue_stores, acc.data):
        return None

    tile, first = loop.loop_var, loop.min
    prev_var = tir.Var(acc.data.name + "_prev", acc.data.type_annotation)
    prev = tir.decl_buffer(acc.shape, acc.dtype, name=acc.name + "_prev", data=prev_var)
    index = acc.shape[0].dtype  # the buffer's own index type (int32 or int64)
    keep = [tir.BufferStore(prev, tir.BufferLoad(acc, [tir.IntImm(index, k)]), [tir.IntImm(index, k)])
            for k in range(elements)]
    previous = [_reading(s, acc.data, prev) for s in epilogues]
    # Epilogue statement e goes after product step floor(e * steps / epilogues): spread evenly.
    interleaved: List[tir.Stmt] = hints + inits
    placed = 0
    for k, step in enumerate(steps):
        interleaved.append(step)
        while placed < len(previous) and placed * len(steps) <= k * len(previous):
            interleaved.append(stmt_functor.substitute(previous[placed], {tile: tile - 1}))
            placed += 1
    interleaved += [stmt_functor.substitute(s, {tile: tile - 1}) for s in previous[placed:]] + keep
    # The steady loop runs over tiles first + 1 .. first + n - 1 with a zero-based variable (TVM's
    # code generator wants loops to start at 0).
    steady_var = tir.Var(tile.name + "_steady", tile.dtype)
    steady = tir.For(steady_var, tir.IntImm(tile.dtype, 0), tir.IntImm(tile.dtype, loop.extent.value - 1),
                     tir.ForKind.SERIAL,
                     stmt_functor.substitute(tir.SeqStmt(interleaved), {tile: steady_var + first + 1}))
    prologue = [stmt_functor.substitute(s, {tile: first}) for s in hints + inits + steps] + keep
    last = [stmt_functor.substitute(s, {tile: first + loop.extent.value - 1}) for s in previous]
    return tir.Allocate(prev_var, acc.dtype, [tir.IntImm(index, elements)], tir.const(True, "bool"),
                        tir.SeqStmt(prologue + [steady] + last))


def pipeline_epilogues(func: tir.PrimFunc, max_steps: int = MAX_STEPS) -> Tuple[tir.PrimFunc, int]:
    """``func`` with its dot-product tile loops pipelined, and how many loops changed.

    Only functions whose arguments do not alias (``tir.noalias``, as TVM's lowering marks them) are
    changed: the rewrite moves an epilogue's stores past the next tile's loads of other buffers.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((4,), name="x"); y = te.compute((4,), lambda i: x[i] + 1.0, name="y")
    >>> func = tvm.lower(te.create_schedule(y.op), [x, y])["main"]
    >>> pipeline_epilogues(func)[1]  # a float kernel: nothing to pipeline
    0
    """
    if not bool(func.attrs and func.attrs.get("tir.noalias", False)):
        return func, 0
    # The unrolled copies repeat the reduction's let-bound variables: each gets its own (ssa).
    return rewrite_nodes(func, lambda node: _pipelined(node, max_steps), ["tir.For"], ssa=True)


def rewrite_nodes(func: tir.PrimFunc, rewrite: Callable[[tir.Node], Optional[tir.Node]], kinds: List[str],
                  ssa: bool = False) -> Tuple[tir.PrimFunc, int]:
    """``(func, count)``: each node of ``kinds`` in ``func`` (innermost first) for which ``rewrite(node)``
    gives another replaced by it (``func`` itself when none is); ``ssa``: a rewrite that copies statements
    then has each copy's variables renamed (``tir.transform.ConvertSSA``).

    Examples
    --------
    >>> x = tvm.tir.Var("x", "int32")
    >>> func = tvm.tir.PrimFunc([x], tvm.tir.Evaluate(x + 1))
    >>> rewrite_nodes(func, lambda add: add.a * 2, ["tir.Add"])[1]
    1
    """
    count = [0]

    def post(node):
        new = rewrite(node)
        count[0] += new is not None
        return new

    body = stmt_functor.ir_transform(func.body, None, post, kinds)
    if not count[0]:
        return func, 0
    if not ssa:
        return func.with_body(body), count[0]
    return tvm.tir.transform.ConvertSSA()(tvm.IRModule({"main": func.with_body(body)}))["main"], count[0]


def pipeline_module(mod: tvm.IRModule, max_steps: int = MAX_STEPS) -> tvm.IRModule:
    """:func:`pipeline_epilogues` on each function of ``mod`` (the module itself when nothing changes).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((4,), name="x"); y = te.compute((4,), lambda i: x[i] * 2.0, name="y")
    >>> mod = tvm.lower(te.create_schedule(y.op), [x, y])
    >>> pipeline_module(mod).same_as(mod)
    True
    """
    return rewrite_functions(mod, lambda func: pipeline_epilogues(func, max_steps), logger,
                             "pipelined %d dot-product tile loops")


def rewrite_functions(mod: tvm.IRModule, rewrite: Callable[[tir.PrimFunc], Tuple[tir.PrimFunc, int]],
                      log: logging.Logger, message: str) -> tvm.IRModule:
    """``rewrite`` (a function -> (function, loops changed)) on each TIR function of ``mod``; ``mod`` itself
    when no loop changed, else a new module, with ``message % loops`` logged at debug level."""
    functions, total = {}, 0
    for var, func in mod.functions.items():
        if isinstance(func, tir.PrimFunc):
            func, count = rewrite(func)
            total += count
        functions[var] = func
    if not total:
        return mod
    log.debug(message, total)
    return tvm.IRModule(functions, attrs=mod.attrs)
