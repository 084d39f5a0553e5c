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
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence, Tuple

from .._tvm import tvm
from tvm import tir
from tvm.tir import stmt_functor

from . import pipeline
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
    """:func:`interleave` on each function of ``mod`` (the module itself when nothing changes)."""
    return pipeline.rewrite_functions(mod, interleave, logger, "moved %d tile epilogues into their programs")
