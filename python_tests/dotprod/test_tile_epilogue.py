"""A flat AMX conv's epilogue moved into its tile program step by step (dotprod.tile_epilogue): the same
values in both forms of the tiles, every flat task shape (whole steps, a tail step, one step), and only
flat convs change."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_tcutils._tvm import tvm
from tvm import autotvm, te

from tvm_tcutils.dotprod import tile_epilogue
from tvm_tcutils.dotprod.topi.common import requantized
from tvm_tcutils.dotprod.topi.conv2d_amx import conv2d_nchwc_amx, schedule_conv2d_nchwc_amx
from tvm_tcutils.dotprod.topi.tiles import STEP_STRIP, reference_tiles

from conftest import amx_runs_here, host_dot_target, with_mattr
from test_amx import AMX_TARGET, _conv

#: (C, H, W, O, k, stride, pad): 224-pixel tasks in whole steps (ResNet-50's 56 x 56), a whole image with a
#: tail step (28 x 28: 24 steps and one tile), a tail of a partial tile (14 x 14), a 7 x 7 plane (one step
#: and a tail of 17 pixels), two 64-channel output blocks; a 3x3 conv (not flat: left alone).
SHAPES = [(64, 56, 56, 128, 1, 1, 0), (128, 28, 28, 64, 1, 1, 0), (64, 14, 14, 128, 1, 1, 0),
          (128, 7, 7, 128, 1, 1, 0), (64, 6, 20, 128, 1, 1, 0)]


def _lowered(shape, reference: bool = False) -> tvm.IRModule:
    c, h, w, o, k, stride, pad = shape
    data = te.placeholder((1, c // 64, h, w, 64), "uint8", name="data")
    kernel = te.placeholder((o // 64, c // 64, k, k, 16, 64, 4), "int8", name="kernel")
    scope = reference_tiles() if reference else tvm.target.Target(AMX_TARGET)
    with scope, tvm.target.Target(AMX_TARGET):
        cfg = autotvm.get_config()
        out = requantized(conv2d_nchwc_amx(cfg, data, kernel, stride, pad, 1, "NCHW64c", "NCHW64c"), (1, 4))
        return tvm.lower(schedule_conv2d_nchwc_amx(cfg, [out]), [data, kernel, *out.op.input_tensors[1:], out])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "c{}-{}x{}-o{}".format(*s))
def test_a_flat_convs_epilogue_moves_into_its_program(shape):
    func, count = tile_epilogue.interleave(_lowered(shape)["main"])
    assert count == 1
    # Every step's stores are followed by its share: the epilogue reads the int32 buffer only there.
    text = func.script()
    program_end = text.rindex("llvm.x86.ldtilecfg")  # the caller's configuration back, after the program
    assert "requantized" in text[:program_end] and "for " not in text[program_end:]


def test_a_conv_that_is_not_flat_keeps_its_epilogue_after_the_program():
    func = _lowered((64, 8, 8, 64, 3, 1, 1))["main"]
    assert tile_epilogue.interleave(func) == (func, 0) and STEP_STRIP not in func.script()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "c{}-{}x{}-o{}".format(*s))
def test_reference_form_with_the_moved_epilogue_is_bit_exact(shape, monkeypatch):
    moved = []
    original = tile_epilogue.interleave
    monkeypatch.setattr(tile_epilogue, "interleave", lambda f: (lambda r: (moved.append(r[1]), r)[1])(original(f)))
    _, got, expected = _conv(with_mattr(host_dot_target(), "+amx-tile", "+amx-int8"), shape, reference=True,
                             epilogue=True, seed=5)
    assert sum(moved) == 1
    np.testing.assert_array_equal(got, expected)
    assert np.unique(got).size > 50


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "c{}-{}x{}-o{}".format(*s))
def test_real_tiles_with_the_moved_epilogue_are_bit_exact_where_the_cpu_has_amx(shape):
    func, got, expected = _conv(amx_runs_here(), shape, reference=False, epilogue=True, seed=6)
    assert "tdpbusd" in func.get_source("asm")
    np.testing.assert_array_equal(got, expected)
