"""8-bit NCHW max pooling as row and column passes (``dotprod.topi.pool``) and the strategy row that takes it."""
from __future__ import annotations

import numpy as np
import pytest

import tvm
from tvm import relay, te
from tvm.contrib import graph_executor
from tvm.relay.backend import te_compiler

from conftest import each_value_once, host_dot_target
from tvm_tcutils.dotprod.topi.pool import max_pool2d_rows, pool_output_size, schedule_max_pool2d_rows

RNG = np.random.default_rng(5)


def max_pool_reference(data: np.ndarray, pool, strides, padding, ceil_mode: bool) -> np.ndarray:
    """numpy max pool of NCHW data, padded with the dtype's minimum (as TVM pads)."""
    (k_h, k_w), (s_h, s_w), (top, left, bottom, right) = pool, strides, padding
    _, _, height, width = data.shape
    out_h = pool_output_size(height, k_h, s_h, top, bottom, ceil_mode)
    out_w = pool_output_size(width, k_w, s_w, left, right, ceil_mode)
    low = np.iinfo(data.dtype).min
    padded = np.pad(data, ((0, 0), (0, 0), (top, max(0, (out_h - 1) * s_h + k_h - height - top)),
                           (left, max(0, (out_w - 1) * s_w + k_w - width - left))), constant_values=low)
    out = np.full(data.shape[:2] + (out_h, out_w), low, data.dtype)
    for i in range(k_h):
        for j in range(k_w):
            out = np.maximum(out, padded[:, :, i:i + s_h * out_h:s_h, j:j + s_w * out_w:s_w])
    return out


#: (shape, pool, strides, padding, ceil_mode): ShuffleNet's stem pool, GoogLeNet's ceil-mode pools, no
#: padding, a 2x2 one, asymmetric padding and odd sizes.
POOLS = [
    ((1, 24, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), False),
    ((1, 8, 28, 28), (3, 3), (2, 2), (0, 0, 0, 0), True),
    ((2, 3, 15, 13), (2, 2), (2, 2), (0, 0, 0, 0), False),
    ((1, 5, 9, 11), (3, 2), (1, 2), (0, 1, 2, 0), True),
]


@pytest.mark.parametrize("case, dtype", each_value_once(POOLS, ["uint8", "int8"]))
def test_row_and_column_passes_equal_numpy(case, dtype):
    shape, pool, strides, padding, ceil_mode = case
    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    x = te.placeholder(shape, dtype)
    out = max_pool2d_rows(x, pool, strides, padding, ceil_mode)
    func = tvm.build(schedule_max_pool2d_rows([out]), [x, out], "llvm")
    result = tvm.nd.empty([int(d) for d in out.shape], dtype)
    func(tvm.nd.array(data), result)
    np.testing.assert_array_equal(result.numpy(), max_pool_reference(data, pool, strides, padding, ceil_mode))


def test_rejects_data_that_is_not_8bit_nchw():
    with pytest.raises(ValueError, match="8-bit"):
        max_pool2d_rows(te.placeholder((1, 4, 8, 8), "float32"), (2, 2), (2, 2), (0, 0, 0, 0))
    with pytest.raises(ValueError, match="8-bit"):
        max_pool2d_rows(te.placeholder((1, 4, 8, 8, 16), "uint8"), (2, 2), (2, 2), (0, 0, 0, 0))


def _impl(target: str, shape, dtype: str, pool) -> str:
    """The implementation TVM selects for ``pool(x)`` of an ``x`` of ``shape`` and ``dtype``."""
    x = relay.var("x", shape=shape, dtype=dtype)
    call = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], pool(x))))["main"].body
    with tvm.target.Target(target):
        impl, _ = te_compiler.select_implementation(call.op, call.attrs, [te.placeholder(shape, dtype)],
                                                    call.checked_type, tvm.target.Target(target))
    return impl.name


def _pool_impl(target: str, shape, dtype: str, layout: str = "NCHW", dilation=(1, 1)) -> str:
    return _impl(target, shape, dtype, lambda x: relay.nn.max_pool2d(x, (3, 3), (2, 2), dilation, (1, 1),
                                                                     layout=layout))


@pytest.mark.parametrize("target, shape, dtype, layout, dilation, ours", [
    ("llvm -mcpu=znver4", (1, 24, 56, 56), "uint8", "NCHW", (1, 1), True),
    ("llvm -mcpu=core-avx2", (1, 24, 56, 56), "int8", "NCHW", (1, 1), True),
    ("llvm -mcpu=znver4", (1, 24, 56, 56), "float32", "NCHW", (1, 1), False),
    ("llvm -mcpu=znver4", (1, 3, 56, 56, 8), "uint8", "NCHW8c", (1, 1), False),  # TVM vectorizes the lanes
    ("llvm -mcpu=znver4", (1, 24, 56, 56), "uint8", "NCHW", (2, 2), False),
    ("llvm", (1, 24, 56, 56), "uint8", "NCHW", (1, 1), False),  # no dot-product ISA
])
def test_strategy_row_takes_only_8bit_nchw_pools_on_x86(target, shape, dtype, layout, dilation, ours):
    assert (_pool_impl(target, shape, dtype, layout, dilation) == "max_pool2d_rows.tcutils") is ours


def test_pool_with_a_fused_requantize_builds_exact():
    # A QDQ max pool region: u8 in, the pool, an elementwise op fused after it.
    target = host_dot_target()
    data = RNG.integers(0, 256, (1, 24, 30, 30)).astype("uint8")
    x = relay.var("x", shape=data.shape, dtype="uint8")
    y = relay.subtract(relay.nn.max_pool2d(x, (3, 3), (2, 2), padding=(1, 1)), relay.const(3, "uint8"))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=target)
    run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    run.set_input("x", data)
    run.run()
    want = max_pool_reference(data, (3, 3), (2, 2), (1, 1, 1, 1), False) - np.uint8(3)
    np.testing.assert_array_equal(run.get_output(0).numpy(), want)


# --------------------------------------------------------------------------
# Float averages down the rows (a quantized LRN's channel window)
# --------------------------------------------------------------------------
@pytest.mark.parametrize("shape, height, stride, padding, count_include_pad", [
    ((1, 1, 64, 3025), 5, 1, (2, 2), True),   # GoogLeNet's LRN window over 64 channels of 55 x 55
    ((1, 1, 30, 17), 3, 1, (1, 1), True),
    ((2, 3, 11, 9), 4, 2, (2, 1), False),
    ((1, 2, 8, 5), 2, 2, (0, 0), True),
])
def test_column_averages_equal_tvms_pool_bit_for_bit(shape, height, stride, padding, count_include_pad):
    from tvm import topi
    from tvm_tcutils.dotprod.topi.pool import avg_pool2d_columns, schedule_avg_pool2d_columns

    data = RNG.standard_normal(shape).astype("float32")
    x = te.placeholder(shape, "float32")
    ours = avg_pool2d_columns(x, height, stride, padding, count_include_pad)
    theirs = topi.nn.pool2d(x, (height, 1), (stride, 1), (1, 1), (padding[0], 0, padding[1], 0), "avg", False,
                            "NCHW", count_include_pad)
    results = []
    for out, schedule in ((ours, schedule_avg_pool2d_columns([ours])), (theirs, te.create_schedule(theirs.op))):
        func = tvm.build(schedule, [x, out], host_dot_target() if out is ours else "llvm")  # both run here
        result = tvm.nd.empty([int(d) for d in out.shape], "float32")
        func(tvm.nd.array(data), result)
        results.append(result.numpy())
    np.testing.assert_array_equal(results[0], results[1])


def _avg_impl(target: str, shape, dtype: str, pool_size, padding=(2, 0)) -> str:
    return _impl(target, shape, dtype, lambda x: relay.nn.avg_pool2d(x, pool_size, (1, 1), padding=padding,
                                                                     count_include_pad=True))


@pytest.mark.parametrize("target, pool_size, padding, dtype, ours", [
    ("llvm -mcpu=znver4", (5, 1), (2, 0), "float32", True),
    ("llvm -mcpu=znver4", (3, 3), (1, 1), "float32", False),  # summed in another order: TVM's
    ("llvm -mcpu=znver4", (5, 1), (2, 1), "float32", False),
    ("llvm", (5, 1), (2, 0), "float32", False),
])
def test_column_average_row_takes_only_row_windows(target, pool_size, padding, dtype, ours):
    assert (_avg_impl(target, (1, 1, 64, 100), dtype, pool_size, padding) == "avg_pool2d_columns.tcutils") is ours
