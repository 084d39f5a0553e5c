"""The next weight block prefetched by the dot-product kernels' parallel loops (dotprod.prefetch)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tvm
from tvm import tir

from conftest import codegen_and_hook_builds, dot_target, requantized_conv
from tvm_tcutils.dotprod import pipeline, prefetch
from tvm_tcutils.dotprod.topi.conv2d_nchwc import schedule_conv2d_nchwc_dot

RNG = np.random.default_rng(5)
ZNVER4 = "llvm -mcpu=znver4"

#: (data NCHW16c, kernel, padding), each with output rows that reuse one weight block: 1x1 convs with a
#: tile loop (pipelined too; the prefetches in its reduction, or at each tile's start when there are
#: fewer lines than reduction steps), one with 128 product steps (not pipelined), a 3x3 conv.
SHAPES = {
    "1x1_tiles": ((1, 4, 4, 8, 16), (4, 4, 1, 1, 4, 16, 4), 0),
    "1x1_tile_head": ((1, 4, 6, 8, 16), (4, 4, 1, 1, 4, 16, 4), 0),
    "1x1_k512": ((1, 32, 3, 4, 16), (4, 32, 1, 1, 4, 16, 4), 0),
    "3x3": ((1, 2, 4, 4, 16), (4, 2, 3, 3, 4, 16, 4), 1),
}


#: AVX2's kernels as its alter-layout hook packs them: int16 pairs, 8 output channels a block.
AVX2 = "llvm -mcpu=core-avx2"
AVX2_TILES = ((1, 4, 4, 8, 16), (8, 4, 1, 1, 8, 8, 2), 0)


def _lowered(name: str, target: str = ZNVER4) -> tir.PrimFunc:
    with tvm.target.Target(target):
        if target == AVX2:
            cfg, out, args = requantized_conv(*AVX2_TILES, residual=True, kernel_dtype="int16")
        else:
            cfg, out, args = requantized_conv(*SHAPES[name], residual=True)
        return tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), args)["main"]


def _children(stmt):
    if isinstance(stmt, tir.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, (tir.LetStmt, tir.Allocate, tir.AttrStmt, tir.DeclBuffer, tir.For)):
        return [stmt.body]
    if isinstance(stmt, tir.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    return []


def _executed(func: tir.PrimFunc, weights: str):
    """Run the loop nest symbolically: ``(parallel extent, {p: weight elements the dot products read},
    {p: weight elements prefetched}, weight buffer size)`` (an oracle independent of the pass's analysis)."""
    reads, hinted, sizes = {}, {}, {}
    parallel = []
    analyzer = tvm.arith.Analyzer()

    def evaluate(expr, env):
        value = analyzer.simplify(tir.stmt_functor.substitute(expr, env))
        assert isinstance(value, tir.IntImm), value
        return value.value

    def walk(stmt, loops, lets):
        if isinstance(stmt, tir.For):
            if stmt.kind == tir.ForKind.PARALLEL and pipeline.dot_calls(stmt):  # not the padding's
                parallel.append(int(stmt.extent))
            loops = loops + [stmt]
        if isinstance(stmt, tir.LetStmt):
            lets = lets + [(stmt.var, stmt.value)]
        if pipeline.is_hint(stmt):
            record(hinted, stmt.value.args[2].args[0].indices[0], loops, lets)
        if isinstance(stmt, tir.BufferStore):
            for call in pipeline.dot_calls(stmt):
                for arg in call.args[2:]:
                    while isinstance(arg, tir.Call):
                        arg = arg.args[0]
                    if isinstance(arg, tir.BufferLoad) and arg.buffer.name.startswith(weights):
                        sizes[arg.buffer.name] = int(arg.buffer.shape[0])
                        record(reads, arg.indices[0], loops, lets)
        for child in _children(stmt):
            walk(child, loops, lets)

    def record(into, index, loops, lets):
        lanes = int(index.lanes) if isinstance(index, tir.Ramp) else 1
        base = index.base if isinstance(index, tir.Ramp) else index
        ranges = [range(int(loop.min), int(loop.min) + int(loop.extent)) for loop in loops]
        for values in itertools.product(*ranges):
            env = {loop.loop_var: tir.IntImm(loop.loop_var.dtype, v) for loop, v in zip(loops, values)}
            for var, value in lets:
                env[var] = tir.IntImm(var.dtype, evaluate(value, env))
            start = evaluate(base, env)
            p = values[[loop.kind for loop in loops].index(tir.ForKind.PARALLEL)]
            into.setdefault(p, set()).update(range(start, start + lanes))

    walk(func.body, [], [])
    assert len(parallel) == 1 and len(sizes) == 1
    return parallel[0], reads, hinted, next(iter(sizes.values()))


#: Shapes whose pipelined form runs by default: the same prefetch checks after pipelining, so their plain
#: form runs under ``-m slow``.
PIPELINED = ("1x1_tiles", "1x1_tile_head")


@pytest.mark.parametrize("name,pipelined", [pytest.param(name, False, marks=[pytest.mark.slow] if name in PIPELINED
                                                         else []) for name in sorted(SHAPES)]
                         + [(name, True) for name in PIPELINED])
def test_each_block_prefetches_the_next_blocks_lines(name, pipelined):
    func, count = prefetch.prefetch_weights(_lowered(name), min_bytes=0)
    assert count == 1
    if pipelined:
        func, changed = pipeline.pipeline_epilogues(func)
        assert changed == name.startswith("1x1_tile")  # the hints travel with the unrolled product steps
    extent, reads, hinted, size = _executed(func, "kernel")
    line = prefetch.LINE
    blocks = []  # runs of iterations reading the same weights
    for p in range(extent):
        if blocks and reads[p] == reads[blocks[-1][0]]:
            blocks[-1].append(p)
        else:
            blocks.append([p])
    assert len(blocks) >= 2 and all(len(b) >= 2 for b in blocks)
    for block, following in zip(blocks, blocks[1:]):
        wanted = {e // line for e in reads[following[0]]}
        got = {e // line for p in block for e in hinted.get(p, ())}
        assert wanted <= got, f"lines of the next block not prefetched: {sorted(wanted - got)[:8]}"
        assert got <= wanted | {(size - 1) // line}  # nothing else (the clamp aside)
    assert all(0 <= e < size for elements in hinted.values() for e in elements)


def test_small_weights_and_other_isas_untouched():
    func = _lowered("1x1_tiles")
    assert prefetch.prefetch_weights(func) == (func, 0)  # 4 KB of weights: under MIN_BYTES
    avx2 = _lowered("1x1_tiles", AVX2)
    assert "llvm.x86" in avx2.script()
    assert prefetch.prefetch_weights(avx2, min_bytes=0)[1] == 1  # measured there too
    sse = _lowered("1x1_tiles", "llvm -mcpu=nehalem")
    assert prefetch.prefetch_weights(sse, min_bytes=0)[1] == 0  # not measured there


def test_loop_without_block_reuse_untouched():
    """A parallel loop whose iterations each read other weights (one row per block) has nothing to hide
    the next fetch behind."""
    func = _lowered("1x1_tiles")
    rows = 2  # the parallel loop: 2 output-channel blocks x 2 rows
    assert "n_c_outer_fused_y_outer_fused // 2 * 2048" in func.script()

    def post(node):  # one row per block: p -> p * rows
        if node.kind != tir.ForKind.PARALLEL:
            return None
        var = tir.Var("single", node.loop_var.dtype)
        body = tir.stmt_functor.substitute(node.body, {node.loop_var: var * rows})
        return tir.For(var, node.min, tir.IntImm(var.dtype, int(node.extent) // rows), node.kind, body)
    single = func.with_body(tir.stmt_functor.ir_transform(func.body, None, post, ["tir.For"]))
    assert prefetch.prefetch_weights(single, min_bytes=0)[1] == 0
    assert prefetch.prefetch_weights(func, min_bytes=0)[1] == 1


def _loops(func):
    found = []
    tir.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.For) else None)
    return found


@pytest.mark.parametrize("target_name,name", [("vnni", name) for name in sorted(SHAPES)] + [("avx2", "1x1_tiles")])
def test_prefetching_kernel_bit_identical(target_name, name, monkeypatch):
    """Through the build hook (prefetches, then pipelining, then TVM's code generator): the same output
    as TVM's own generator, and the machine code prefetches."""
    target = dot_target(target_name)
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    with tvm.target.Target(target):
        if target_name == "avx2":
            cfg, out, args = requantized_conv(*AVX2_TILES, residual=True, kernel_dtype="int16")
        else:
            cfg, out, args = requantized_conv(*SHAPES[name], residual=True)
        schedule = schedule_conv2d_nchwc_dot(cfg, [out])
    _, asm = codegen_and_hook_builds(schedule, args, target, RNG)
    assert "prefetcht0" not in asm[0] and "prefetcht0" in asm[1]
