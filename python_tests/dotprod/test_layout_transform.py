"""The byte-shuffle schedule of 8-bit NCHW <-> NCHW{b}c layout transforms: results, plans, fallbacks."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tvm
from tvm import te, topi

import tvm_tcutils
from tvm_tcutils.dotprod.topi.layout_transform import (
    byte_tile_plan, packed_block, schedule_byte_layout_transform,
)

RNG = np.random.default_rng(11)


def _layouts(direction: str, block: int):
    packed = f"NCHW{block}c"
    return ("NCHW", packed) if direction == "pack" else (packed, "NCHW")


def _source(direction: str, channels: int, height: int, width: int, block: int, dtype: str):
    shape = (1, channels, height, width) if direction == "pack" else (1, channels // block, height, width, block)
    return te.placeholder(shape, dtype, name="x")


def _numpy_transform(array: np.ndarray, direction: str, block: int) -> np.ndarray:
    if direction == "pack":
        n, c, h, w = array.shape
        return array.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)
    n, co, h, w, b = array.shape
    return array.transpose(0, 1, 4, 2, 3).reshape(n, co * b, h, w)


def _run(sched, x, y, data):
    func = tvm.build(sched, [x, y], tvm_tcutils.host_target())
    out = tvm.nd.empty([int(v) for v in y.shape], y.dtype)
    func(tvm.nd.array(data), out)
    return out.numpy()


@pytest.mark.parametrize("direction", ["pack", "unpack"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("channels,height,width,block", [
    (16, 8, 8, 8),     # 16-pixel tiles, one row per call
    (32, 14, 14, 16),  # 196 pixels: the whole plane, 12 16-pixel tiles and a 4-pixel one
    (16, 7, 7, 8),     # 49 pixels: 3 16-pixel tiles and one byte per channel
    (32, 5, 3, 16),    # 15 pixels: 8, 4, 2 and 1-pixel pieces
    (8, 3, 12, 4),     # 12-pixel rows: 4-pixel tiles
    (8, 30, 38, 8),    # 1,140 pixels, too many to move whole: 4-pixel tiles of two rows
    (64, 56, 56, 8),   # a ResNet-50 stage-1 plane: two rows (112 pixels) per call
    (32, 4, 40, 32),   # a 32-channel block (HVX-sized)
    (16, 37, 37, 8),   # 1,369 pixels, no 4-pixel block of rows: one row per call, 16-pixel tiles and the rest
    (4, 230, 230, 4),  # an RGB image padded for a 7x7 stem: 14 16-pixel tiles, a 4- and a 2-pixel one per row
])
def test_matches_numpy(direction, dtype, channels, height, width, block):
    x = _source(direction, channels, height, width, block, dtype)
    src, dst = _layouts(direction, block)
    assert byte_tile_plan(src, dst, x.shape, dtype) is not None
    y = topi.layout_transform(x, src, dst)
    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, [int(v) for v in x.shape]).astype(dtype)
    out = _run(schedule_byte_layout_transform(y, src, dst), x, y, data)
    np.testing.assert_array_equal(out, _numpy_transform(data, direction, block))


@pytest.mark.parametrize("direction", ["pack", "unpack"])
def test_lowers_to_tile_shuffles(direction):
    # The tile moves are whole-vector shuffles, not a loop over single bytes.
    x = _source(direction, 16, 8, 8, 8, "uint8")
    src, dst = _layouts(direction, 8)
    y = topi.layout_transform(x, src, dst)
    text = tvm.lower(schedule_byte_layout_transform(y, src, dst), [x, y]).script()
    assert "T.Shuffle" in text
    # 16-byte vector slices of the channel planes, and no loop inside the parallel one.
    assert re.search(r"\[[^\]]*:[^\]]* \+ 16\]", text)
    assert len(re.findall(r"\bfor \w+ in", text)) == 1
    generic = tvm.lower(topi.x86.schedule_injective([y]), [x, y]).script()
    assert "T.Shuffle" not in generic


@pytest.mark.parametrize("src,dst,shape,dtype", [
    ("NCHW", "NCHW8c", (1, 16, 8, 8), "float32"),   # not 8-bit
    ("NCHW", "NCHW8c", (1, 16, 8, 8), "int32"),
    ("NCHW", "NCHW8c", (1, 12, 8, 8), "uint8"),     # channels not a multiple of the block
    ("NCHW", "NHWC", (1, 16, 8, 8), "uint8"),       # not a channel-block layout
    ("NCHW8c", "NCHW16c", (1, 2, 8, 8, 8), "uint8"),
    ("NCHW8c", "NCHW", (1, 2, 8, 8, 4), "uint8"),   # block disagrees with the shape
])
def test_plan_declines(src, dst, shape, dtype):
    assert byte_tile_plan(src, dst, shape, dtype) is None


def test_plan_declines_dynamic_shapes():
    assert byte_tile_plan("NCHW", "NCHW8c", (1, 16, tvm.tir.Any(), 8), "uint8") is None


def test_packed_block():
    assert [packed_block(s) for s in ("NCHW4c", "NCHW32c", "NCHW", "NHWC8c", "NCHW8n")] == [4, 32, None, None, None]


@pytest.mark.parametrize("case", ["fused_producer", "no_plan"])
def test_other_groups_get_the_injective_schedule(case):
    # A producer fused into the transform (or a transform without a plan: between two channel blocks)
    # falls back to TVM's x86 injective schedule: still built, still right.
    if case == "fused_producer":
        x = te.placeholder((1, 16, 8, 8), "int32", name="x")
        y = topi.layout_transform(topi.cast(x, "uint8"), "NCHW", "NCHW8c")
        sched = schedule_byte_layout_transform(y, "NCHW", "NCHW8c")
        data = RNG.integers(0, 256, (1, 16, 8, 8)).astype("int32")
        expected = _numpy_transform(data.astype("uint8"), "pack", 8)
    else:
        x = te.placeholder((1, 2, 8, 8, 8), "uint8", name="x")
        y = topi.layout_transform(x, "NCHW8c", "NCHW16c")
        sched = schedule_byte_layout_transform(y, "NCHW8c", "NCHW16c")
        data = RNG.integers(0, 256, (1, 2, 8, 8, 8)).astype("uint8")
        expected = _numpy_transform(_numpy_transform(data, "unpack", 8), "pack", 16)
    assert "T.Shuffle" not in tvm.lower(sched, [x, y]).script()
    np.testing.assert_array_equal(_run(sched, x, y, data), expected)
