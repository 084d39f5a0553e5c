"""What AutoTVM tunes is what the network runs: the plain-layout templates measure their packed op alone,
and the package's tuner measures the untuned build's configuration first."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tvm
from tvm import autotvm, te
from tvm.autotvm.env import GLOBAL_SCOPE

from conftest import host_dot_target

from tvm_tcutils.dotprod.isa import for_target
from tvm_tcutils.dotprod.strategy import BATCH_MATMUL_TASK, CONV2D_NCHW_TASK, DENSE_TASK
from tvm_tcutils.dotprod.topi.common import measuring_packed_alone
from tvm_tcutils.dotprod.topi.packing import channel_block
from tvm_tcutils.tuning import _DefaultFirst, default_config_index, valid_indexes


@contextlib.contextmanager
def _tuning():
    """What a tuner's ``tune`` sets while it measures (and restores after)."""
    before = GLOBAL_SCOPE.in_tuning
    GLOBAL_SCOPE.in_tuning = True
    try:
        yield
    finally:
        GLOBAL_SCOPE.in_tuning = before


def _run(task, target, arrays):
    """Build ``task`` on its fallback config and run it on ``arrays`` (numpy, its inputs, told apart by shape
    and dtype): the output and the ``(name, shape)`` of its arguments (output first)."""
    with tvm.target.Target(target):
        sched, bufs = task.instantiate(autotvm.task.space.FallbackConfigEntity())
        func = tvm.build(sched, bufs, target)
    shapes = [(b.op.name, tuple(int(d) for d in b.shape)) for b in bufs]
    inputs = {(tuple(a.shape), str(a.dtype)): a for a in arrays}
    args = [tvm.nd.empty(shapes[0][1], bufs[0].dtype)]
    args += [tvm.nd.array(inputs[(shape, str(b.dtype))]) for b, (_, shape) in zip(bufs[1:], shapes[1:])]
    func(*args)
    return args[0].numpy(), shapes


@pytest.mark.parametrize("chans, out_c, size, padding", [(16, 32, 10, 1), (32, 48, 7, 0)])
def test_conv_task_measures_the_packed_conv_the_network_runs(chans, out_c, size, padding):
    target = host_dot_target()
    isa = for_target(target)
    ic_bn, oc_bn = channel_block(chans, isa.lanes), isa.lanes
    k_dtype = isa.conv_kernel_dtype("int8")
    group = isa.kernel_group(k_dtype)
    args = (te.placeholder((1, chans, size, size), "uint8"), te.placeholder((out_c, chans, 3, 3), "int8"),
            (1, 1), (padding,) * 4, (1, 1), "int32")
    task = autotvm.task.create(CONV2D_NCHW_TASK, args, target)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (1, chans, size, size)).astype("uint8")
    kernel = rng.integers(-128, 128, (out_c, chans, 3, 3)).astype("int8")
    assert not measuring_packed_alone()
    plain, shapes = _run(task, target, [data, kernel])
    assert [len(s) for _, s in shapes] == [4, 4, 4]  # packs and unpacks inside the kernel
    # The layouts alter-layout gives the network's conv: NCHW{ic_bn}c data, OIHW{ic_bn/g}i{oc_bn}o{g}i kernel.
    data_p = data.reshape(1, chans // ic_bn, ic_bn, size, size).transpose(0, 1, 3, 4, 2)
    kernel_p = kernel.astype(k_dtype).reshape(out_c // oc_bn, oc_bn, chans // ic_bn, ic_bn // group, group, 3, 3)
    kernel_p = kernel_p.transpose(0, 2, 5, 6, 3, 1, 4)
    bias = rng.integers(-5000, 5000, (out_c // oc_bn, oc_bn)).astype("int32")
    scale = (rng.random((out_c // oc_bn, oc_bn)) * 1e-3).astype("float32")
    with _tuning():
        assert measuring_packed_alone()
        packed, shapes = _run(task, target, [data_p, kernel_p, bias, scale])
    # The conv alone on packed operands, ending as in a quantized network (requantized to uint8).
    assert sorted((name, len(shape)) for name, shape in shapes[1:]) == [
        ("bias", 2), ("data_pack", 5), ("kernel_pack", 7), ("scale", 2)]
    assert packed.dtype == np.uint8
    conv = plain.reshape(1, out_c // oc_bn, oc_bn, *plain.shape[2:]).transpose(0, 1, 3, 4, 2)
    value = (conv + bias[None, :, None, None, :]).astype("float32") * scale[None, :, None, None, :]
    np.testing.assert_array_equal(packed, np.rint(np.clip(value, 0, 255)).astype("uint8"))
    assert 0 < np.count_nonzero(packed) < packed.size  # neither all clipped to 0 nor all nonzero


def test_dense_task_measures_the_packed_dense_the_network_runs():
    target = host_dot_target()
    lanes = for_target(target).lanes
    m, n, k = 4, 2 * lanes, 64
    task = autotvm.task.create(DENSE_TASK, (te.placeholder((m, k), "uint8"), te.placeholder((n, k), "int8"),
                                            None, "int32"), target)
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (m, k)).astype("uint8")
    weight = rng.integers(-128, 128, (n, k)).astype("int8")
    plain, shapes = _run(task, target, [data, weight])
    assert [len(s) for _, s in shapes] == [2, 2, 2]
    weight_p = weight.reshape(n // lanes, lanes, k // 4, 4).transpose(0, 2, 1, 3)  # NC{lanes}n4c
    bias = rng.integers(-3000, 3000, n).astype("int32")
    scale = (rng.random(n) * 0.02).astype("float32")
    with _tuning():
        packed, shapes = _run(task, target, [data, weight_p, bias, scale])
    # The dense alone on its packed weight, ending as in a quantized network (requantized to uint8).
    assert sorted((name, len(shape)) for name, shape in shapes[1:]) == [
        ("bias", 1), ("data_pack", 2), ("scale", 1), ("weight_pack", 4)]
    assert packed.dtype == np.uint8
    value = (plain + bias).astype("float32") * scale
    np.testing.assert_array_equal(packed, np.rint(np.clip(value, 0, 255)).astype("uint8"))
    assert 0 < np.count_nonzero(packed) < packed.size  # neither all clipped to 0 nor all nonzero


def test_the_tuner_measures_the_untuned_configuration_first():
    target = "llvm -mcpu=znver4"  # lowering only: nothing runs
    args = (te.placeholder((1, 64, 58, 58), "uint8"), te.placeholder((64, 64, 3, 3), "int8"),
            (1, 1), (0, 0, 0, 0), (1, 1), "int32")
    task = autotvm.task.create(CONV2D_NCHW_TASK, args, target)
    index = default_config_index(task)
    fallback = autotvm.task.space.FallbackConfigEntity()
    with tvm.target.Target(target):
        task.instantiate(fallback)
    chosen = task.config_space.get(index)
    assert {name: str(chosen[name]) for name in task.config_space.space_map} == \
        {name: str(fallback[name]) for name in task.config_space.space_map}
    tuner = _DefaultFirst(task, index, loss_type="reg")
    first = tuner.next_batch(4)
    assert first[0].index == index and len({c.index for c in first}) == 4
    assert index not in {c.index for c in tuner.next_batch(8)}


def _rows_by_blocks(cfg) -> int:
    return cfg["tile_m"].val * cfg["tile_nb"].val


def _conv_tile(cfg) -> int:
    return cfg["tile_oc"].val * cfg["tile_ow"].val * cfg["tile_oh"].val


#: Tuning spaces: (template, arguments, accumulator vectors of a point). Lowering only: nothing runs.
SPACES = {
    "dense 128x256x1024": (DENSE_TASK, lambda: (te.placeholder((128, 256), "uint8"),
                                                te.placeholder((1024, 256), "int8"), None, "int32"), _rows_by_blocks),
    "dense 1x2048x1008": (DENSE_TASK, lambda: (te.placeholder((1, 2048), "uint8"),
                                               te.placeholder((1008, 2048), "int8"), None, "int32"), _rows_by_blocks),
    "batch_matmul 12x128x64x128": (BATCH_MATMUL_TASK, lambda: (
        te.placeholder((12, 128, 64), "uint8"), te.placeholder((12, 128, 64), "uint8"), None, "int32", False, True),
        _rows_by_blocks),
    "conv 3x3 64 56x56": (CONV2D_NCHW_TASK, lambda: (
        te.placeholder((1, 64, 58, 58), "uint8"), te.placeholder((64, 64, 3, 3), "int8"), (1, 1), (0, 0, 0, 0),
        (1, 1), "int32"), _conv_tile),
}


@pytest.mark.parametrize("target,case,most", [
    # VNNI: a dense or batch_matmul tile's 16th zmm accumulator reaches TVM's 1024-byte stack bound (its sums
    # would live in memory); a conv tile may use 24 (32 registers less 8), and 56's divisors give 16 at most.
    ("llvm -mcpu=znver4", "dense 128x256x1024", 15),
    ("llvm -mcpu=znver5", "dense 128x256x1024", 15),
    ("llvm -mcpu=znver4", "dense 1x2048x1008", 9),  # a classifier's one row: 63 blocks, divisors up to 24
    ("llvm -mcpu=znver5", "batch_matmul 12x128x64x128", 15),
    ("llvm -mcpu=znver4", "conv 3x3 64 56x56", 16),
    ("llvm -mcpu=znver5", "conv 3x3 64 56x56", 16),
    # AVX2's 16 ymm registers, two per operand.
    ("llvm -mcpu=core-avx2", "dense 128x256x1024", 12),
    ("llvm -mcpu=core-avx2", "batch_matmul 12x128x64x128", 8),
    ("llvm -mcpu=core-avx2", "conv 3x3 64 56x56", 8),
    ("llvm -mcpu=nehalem", "batch_matmul 12x128x64x128", 12),
])
def test_tuning_spaces_hold_tiles_that_stay_in_registers(target, case, most):
    template, args, accumulators = SPACES[case]
    task = autotvm.task.create(template, args(), target)
    space = task.config_space
    indexes = valid_indexes(space)
    assert len(indexes) == len(space)
    counts = [accumulators(space.get(i)) for i in indexes]
    assert max(counts) == most  # none past the bound, and the bound's own tiles kept
    default = default_config_index(task)  # the untuned tile is a point: the tuner measures it first
    assert default is not None and accumulators(space.get(default)) <= most
    with pytest.raises(IndexError):  # a tile past the bound is not one of the points
        space.get(next(i for i in range(space.range_length) if i not in set(indexes)))
