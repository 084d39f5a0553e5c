"""The row schedule of 8-bit image pads (``dotprod.topi.pad``) and the strategy row that takes it."""
from __future__ import annotations

import numpy as np
import pytest

import tvm
from tvm import relay, te, tir, topi
from tvm.contrib import graph_executor
from tvm.relay.backend import te_compiler

from conftest import host_dot_target
from tvm_tcutils.dotprod.topi.pad import row_pad_applies, schedule_row_pad

RNG = np.random.default_rng(11)


# (shape, pad before, pad after): the QDQ stem's image pad, asymmetric, 3-D, one row.
PADS = [
    ((1, 3, 20, 19), (0, 0, 3, 3), (0, 0, 3, 3)),
    ((2, 5, 7, 9), (0, 1, 0, 2), (0, 0, 3, 1)),
    ((4, 6, 33), (1, 0, 5), (0, 2, 0)),
    ((1, 1), (0, 0), (0, 7)),
]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("shape,before,after", PADS)
def test_row_schedule_equals_numpy_with_a_fused_producer(shape, before, after, dtype):
    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    x = te.placeholder(shape, dtype, name="x")
    flipped = te.compute(shape, lambda *i: x(*i) ^ tir.const(1, dtype), name="flip", tag="elemwise")
    y = topi.nn.pad(flipped, before, after, pad_value=tir.const(-3 if dtype == "int8" else 250, dtype))
    func = tvm.build(schedule_row_pad(y), [x, y], "llvm")
    out = tvm.nd.empty([int(v) for v in y.shape], dtype)
    func(tvm.nd.array(data), out)
    expected = np.pad(data ^ np.array(1, dtype), list(zip(before, after)), constant_values=-3 if dtype == "int8" else 250)
    np.testing.assert_array_equal(out.numpy(), expected)


def _pad_impl(target: str, shape, dtype: str, pad_width, mode: str = "constant") -> str:
    x = relay.var("x", shape=shape, dtype=dtype)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.nn.pad(x, pad_width,
                                                                                               pad_mode=mode))))
    call = mod["main"].body
    with tvm.target.Target(target):
        impl, _ = te_compiler.select_implementation(
            call.op, call.attrs, [te.placeholder(shape, dtype), te.placeholder((), dtype)], call.checked_type,
            tvm.target.Target(target))
    return impl.name


IMAGE = ((0, 0), (0, 0), (3, 3), (3, 3))
BLOCKED = ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0))


@pytest.mark.parametrize("target,shape,dtype,pad_width,mode,expected", [
    ("llvm -mcpu=znver4", (1, 3, 8, 8), "uint8", IMAGE, "constant", "pad_rows.tcutils"),
    ("llvm -mcpu=core-avx2", (1, 3, 8, 8), "int8", IMAGE, "constant", "pad_rows.tcutils"),
    ("llvm -mcpu=znver4", (1, 3, 8, 8), "float32", IMAGE, "constant", "pad.generic"),
    ("llvm -mcpu=znver4", (1, 3, 8, 8), "uint8", IMAGE, "edge", "pad.generic"),
    ("llvm -mcpu=znver4", (1, 4, 8, 8, 16), "uint8", BLOCKED, "constant", "pad.generic"),  # TVM's is as fast
    ("llvm", (1, 3, 8, 8), "uint8", IMAGE, "constant", "pad.generic"),  # no dot-product ISA: not the package's
])
def test_pad_row_takes_only_8bit_image_pads_on_x86(target, shape, dtype, pad_width, mode, expected):
    assert _pad_impl(target, shape, dtype, pad_width, mode) == expected


def test_qdq_image_pad_in_a_built_model_is_exact():
    # The zero-point pad QNN makes of a u8 stem's padding: built through relay.build, it equals numpy's.
    target = host_dot_target()
    data = RNG.integers(0, 256, (1, 3, 15, 17)).astype("uint8")
    x = relay.var("x", shape=data.shape, dtype="uint8")
    y = relay.nn.pad(relay.add(x, relay.const(1, "uint8")), IMAGE, relay.const(9, "uint8"))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=target)
    run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    run.set_input("x", data)
    run.run()
    np.testing.assert_array_equal(run.get_output(0).numpy(), np.pad(data + np.uint8(1), IMAGE, constant_values=9))
    assert row_pad_applies(IMAGE, "uint8")
