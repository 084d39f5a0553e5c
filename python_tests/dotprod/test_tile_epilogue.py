"""An AMX conv's epilogue moved into its tile program step by step (dotprod.tile_epilogue): the same
values in both forms of the tiles, for every kind of task (flat runs of pixels, one row, stacked short
rows, the RGB stem) and task shape (whole steps, a tail step, one step); a conv without an epilogue keeps
its program as it is."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_tcutils._tvm import tvm
from tvm import autotvm, te

from tvm_tcutils.dotprod import tile_epilogue
from tvm_tcutils.dotprod.topi.common import REQUANTIZED, requantized
from tvm_tcutils.dotprod.topi.conv2d_amx import conv2d_nchwc_amx, schedule_conv2d_nchwc_amx
from tvm_tcutils.dotprod.topi.tiles import reference_tiles

from conftest import amx_runs_here, host_dot_target, with_mattr
from test_amx import AMX_TARGET, _conv, _stem

#: (C, H, W, O, k, stride, pad). Flat: 224-pixel tasks in whole steps (ResNet-50's 56 x 56), a whole image
#: with a tail step (28 x 28: 24 steps and one tile), a tail of a partial tile (14 x 14), a 7 x 7 plane (one
#: step and a tail of 17 pixels), two 64-channel output blocks. One row a task: a 3x3 conv on 56-pixel rows
#: (4 equal tiles of 14: two steps), a strided 3x3 and a strided 1x1 (rows read at stride 2), odd rows (21
#: pixels: a tile and a partial one). Stacked rows: 3x3 convs on 14 x 14 and 8 x 8 planes (tasks of whole
#: steps of rows; 7 x 7 planes run wide, their epilogue after the program: test_amx).
SHAPES = [(64, 56, 56, 128, 1, 1, 0), (128, 28, 28, 64, 1, 1, 0), (64, 14, 14, 128, 1, 1, 0),
          (128, 7, 7, 128, 1, 1, 0), (64, 6, 20, 128, 1, 1, 0),
          (64, 56, 56, 64, 3, 1, 1), (128, 28, 28, 128, 3, 2, 1), (64, 20, 20, 128, 1, 2, 0),
          (64, 6, 21, 64, 3, 1, 1),
          (256, 14, 14, 128, 3, 1, 1), (128, 8, 8, 128, 3, 1, 1)]
SHAPE_IDS = ["c{}-{}x{}-o{}-k{}s{}p{}".format(*s) for s in SHAPES]
#: The shapes whose reference-form run (a CPU build and run each) is the default one: one of each kind above
#: with its edge (a tail step, a partial tile, odd rows, rows at stride 2, stacked rows); the others run under
#: ``-m slow`` (every shape's program is still checked structurally by default, and run on AMX CPUs).
RUN_BY_DEFAULT = {(128, 28, 28, 64, 1, 1, 0), (64, 14, 14, 128, 1, 1, 0), (128, 28, 28, 128, 3, 2, 1),
                  (64, 6, 21, 64, 3, 1, 1), (128, 8, 8, 128, 3, 1, 1)}
RUN_SHAPES = [pytest.param(s, id=i, marks=[] if s in RUN_BY_DEFAULT else [pytest.mark.slow])
              for s, i in zip(SHAPES, SHAPE_IDS)]


def _lowered(shape, reference: bool = False) -> tvm.IRModule:
    c, h, w, o, k, stride, pad = shape
    data = te.placeholder((1, c // 64, h, w, 64), "uint8", name="data")
    kernel = te.placeholder((o // 64, c // 64, k, k, 16, 64, 4), "int8", name="kernel")
    scope = reference_tiles() if reference else tvm.target.Target(AMX_TARGET)
    with scope, tvm.target.Target(AMX_TARGET):
        cfg = autotvm.get_config()
        out = requantized(conv2d_nchwc_amx(cfg, data, kernel, stride, pad, 1, "NCHW64c", "NCHW64c"), (1, 4))
        return tvm.lower(schedule_conv2d_nchwc_amx(cfg, [out]), [data, kernel, *out.op.input_tensors[1:], out])


def _moved_into_program(func: tvm.tir.PrimFunc) -> bool:
    """Whether every step's stores are followed by its share: the epilogue reads the int32 buffer only
    inside the program, and no loop runs after it."""
    text = func.script()
    program_end = text.rindex("llvm.x86.ldtilecfg")  # the caller's configuration back, after the program
    return "requantized" in text[:program_end] and "for " not in text[program_end:]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_a_convs_epilogue_moves_into_its_program(shape):
    func, count = tile_epilogue.interleave(_lowered(shape)["main"])
    assert count == 1 and _moved_into_program(func)


def _lowered_3x3(epilogue=None) -> tvm.tir.PrimFunc:
    """A 3x3 conv on 40-pixel rows, lowered for the real tiles, with ``epilogue(conv)`` after it if given."""
    data = te.placeholder((1, 1, 8, 40, 64), "uint8", name="data")
    kernel = te.placeholder((2, 1, 3, 3, 16, 64, 4), "int8", name="kernel")
    with tvm.target.Target(AMX_TARGET):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_amx(cfg, data, kernel, 1, 1, 1, "NCHW64c", "NCHW64c")
        out = epilogue(out) if epilogue else out
        return tvm.lower(schedule_conv2d_nchwc_amx(cfg, [out]), [data, kernel, out])["main"]


def test_a_conv_without_an_epilogue_keeps_its_program():
    func = _lowered_3x3()
    assert tile_epilogue.interleave(func) == (func, 0)


@pytest.mark.parametrize("shape", RUN_SHAPES)
def test_reference_form_with_the_moved_epilogue_is_bit_exact(shape, monkeypatch):
    moved = []
    original = tile_epilogue.interleave
    monkeypatch.setattr(tile_epilogue, "interleave", lambda f: (lambda r: (moved.append(r[1]), r)[1])(original(f)))
    _, got, expected = _conv(with_mattr(host_dot_target(), "+amx-tile", "+amx-int8"), shape, reference=True,
                             epilogue=True, seed=5)
    assert sum(moved) == 1
    np.testing.assert_array_equal(got, expected)
    assert np.unique(got).size > 50


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_real_tiles_with_the_moved_epilogue_are_bit_exact_where_the_cpu_has_amx(shape):
    func, got, expected = _conv(amx_runs_here(), shape, reference=False, epilogue=True, seed=6)
    asm = func.get_source("asm")
    # The accumulators start from the bias (bias_into_tiles): no tile is zeroed.
    assert "tdpbusd" in asm and "tilezero" not in asm
    np.testing.assert_array_equal(got, expected)


def _bias_reads(func: tvm.tir.PrimFunc) -> tuple:
    """``(vector reads of the bias, tile loads of it with a row stride of 0, tiles zeroed)``."""
    bias = func.buffer_map[func.params[2]].data
    text = func.script()
    loads = []
    tvm.tir.stmt_functor.post_order_visit(func.body, lambda n: loads.append(n) if isinstance(n, tvm.tir.BufferLoad)
                                          and n.buffer.data.same_as(bias) and n.dtype != "int32" else None)
    stride0 = [line for line in text.splitlines() if "tileloadd64" in line and "bias" in line
               and line.rstrip().endswith("T.int64(0))")]
    return len(loads), len(stride0), text.count("tilezero")


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_the_bias_starts_the_accumulators(shape):
    moved, _ = tile_epilogue.interleave(_lowered(shape)["main"])
    vectors, tile_loads, zeroed = _bias_reads(moved)
    assert vectors > 0 and tile_loads == 0 and zeroed > 0
    func, steps = tile_epilogue.bias_into_tiles(moved)
    # Every step's accumulators load the bias (a tail step too); the epilogue no longer reads it.
    assert steps == (2 if _has_tail(moved) else 1)
    assert _bias_reads(func) == (0, zeroed, 0)


def _has_tail(func: tvm.tir.PrimFunc) -> bool:
    return func.script().count("llvm.x86.ldtilecfg") > 2  # own configuration, a tail's, the caller's back


def test_a_bias_read_outside_the_steps_keeps_the_zeroed_tiles():
    # 7 x 7 planes run wide: their epilogue runs after the program, where no step maps onto its reads.
    moved, count = tile_epilogue.interleave(_lowered((128, 7, 7, 128, 3, 1, 1))["main"])
    assert count == 0
    assert tile_epilogue.bias_into_tiles(moved) == (moved, 0)


def test_a_conv_without_a_bias_keeps_the_zeroed_tiles():
    # A float epilogue that reads the int32 product without adding anything to it.
    func = _lowered_3x3(lambda conv: te.compute(conv.shape, lambda *i: conv(*i).astype("float32") * 0.5,
                                                name=REQUANTIZED, tag="elemwise"))
    moved, _ = tile_epilogue.interleave(func)
    assert tile_epilogue.bias_into_tiles(moved) == (moved, 0)


#: A 7x7 RGB stem at stride 2 on 28-pixel rows (a step and a tail), two output blocks; a 3x3 one on 38-pixel rows.
STEM_SHAPES = [(13, 61, 128, 7, 2), (6, 40, 64, 3, 1)]


@pytest.mark.parametrize("shape", STEM_SHAPES, ids=lambda s: "{}x{}-o{}-k{}s{}".format(*s))
def test_reference_stem_with_the_moved_epilogue_is_bit_exact(shape, monkeypatch):
    moved = []
    original = tile_epilogue.interleave
    monkeypatch.setattr(tile_epilogue, "interleave", lambda f: (lambda r: (moved.append(r[1]), r)[1])(original(f)))
    _, got, expected = _stem(with_mattr(host_dot_target(), "+amx-tile", "+amx-int8"), shape, reference=True,
                             seed=7, epilogue=True)
    assert sum(moved) == 1
    np.testing.assert_array_equal(got, expected)
    assert np.unique(got).size > 50


@pytest.mark.parametrize("shape", STEM_SHAPES[:1], ids=lambda s: "{}x{}-o{}-k{}s{}".format(*s))
def test_real_stem_with_the_moved_epilogue_is_bit_exact_where_the_cpu_has_amx(shape):
    func, got, expected = _stem(amx_runs_here(), shape, reference=False, seed=8, epilogue=True)
    assert "tdpbusd" in func.get_source("asm")
    np.testing.assert_array_equal(got, expected)


def test_each_tile_starts_from_the_biases_of_its_columns():
    # 14 x 14, 128 channels: strips of 2 x 16 channels, steps of 2 x 16 pixels; tiles (pixels, channels)
    # (0, 0), (0, 16), (16, 0), (16, 16), then a tail step of one pixel tile.
    func, _ = tile_epilogue.bias_into_tiles(tile_epilogue.interleave(_lowered(SHAPES[2])["main"])[0])
    starts = [line.split("bias_1[")[1].split("]")[0] for line in func.script().splitlines()
              if "tileloadd64" in line and "bias_1[" in line]
    block = "i0_i1_fused_i2_outer_fused * 64 + strip * 32"
    assert starts == [block, block + " + 16", block, block + " + 16", block, block + " + 16"]
