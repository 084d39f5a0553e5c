"""Vector widths of x86 injective groups TVM's 16-lane split leaves scalar (``dotprod.topi.injective``)."""
from __future__ import annotations

import numpy as np
import pytest

import tvm
from tvm import relay, te, topi

from conftest import dot_target
from tvm_tcutils.dotprod.topi.injective import scalar_in_tvm, schedule_injective, vector_factor

RNG = np.random.default_rng(9)


@pytest.mark.parametrize("extent, lanes, scalar", [
    (7, 7, False), (16, 16, False), (28, 14, True), (56, 14, True), (112, 16, False), (17, 1, True), (30, 15, True),
])
def test_vector_factor_divides_the_extent(extent, lanes, scalar):
    assert vector_factor(extent) == lanes and scalar_in_tvm(extent) is scalar
    assert extent % vector_factor(extent) == 0


def _vector_stores(func) -> set:
    lanes = set()
    tvm.tir.stmt_functor.post_order_visit(func.body, lambda node: lanes.add(node.value.dtype) if isinstance(
        node, tvm.tir.BufferStore) else None)
    return lanes


def test_unpacked_requantize_is_vectorized_and_exact():
    # A grouped conv's int32 blocks unpacked, a group's padding sliced off, requantized to u8: 28 columns.
    x = te.placeholder((1, 12, 28, 28, 16), "int32")
    plain = topi.layout_transform(x, "NCHW16c", "NCHW")
    sliced = topi.reshape(topi.strided_slice(topi.reshape(plain, (1, 4, 48, 28, 28)), [0, 0, 0, 0, 0],
                                             [1, 4, 34, 28, 28]), (1, 136, 28, 28))
    out = te.compute(sliced.shape, lambda *i: te.max(te.min(sliced(*i) // 7, 255), 0).astype("uint8"))
    with tvm.target.Target("llvm -mcpu=znver4"):
        s = schedule_injective(out)
    assert "uint8x14" in _vector_stores(tvm.lower(s, [x, out])["main"])
    data = RNG.integers(-2000, 2000, (1, 12, 28, 28, 16)).astype("int32")
    func = tvm.build(s, [x, out], dot_target("vnni"))
    result = tvm.nd.empty((1, 136, 28, 28), "uint8")
    func(tvm.nd.array(data), result)
    unpacked = data.transpose(0, 1, 4, 2, 3).reshape(1, 4, 48, 28, 28)[:, :, :34].reshape(1, 136, 28, 28)
    np.testing.assert_array_equal(result.numpy(), np.clip(unpacked // 7, 0, 255).astype("uint8"))


def test_groups_tvm_vectorizes_keep_tvms_schedule():
    x = te.placeholder((1, 8, 14, 32), "int32")
    assert schedule_injective(te.compute(x.shape, lambda *i: x(*i) + 1)) is None


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_relay_build_of_a_tail_group_equals_numpy(dtype):
    # Float models take the same schedule where TVM's is scalar: the same values (elementwise ops only).
    target = dot_target("vnni")
    x = relay.var("x", shape=(2, 5, 9, 56), dtype=dtype)
    y = relay.transpose(relay.multiply(x, relay.const(3, dtype)), (0, 1, 3, 2))
    y = relay.add(relay.reshape(y, (2, 5, 56, 9)), relay.const(1, dtype))
    y = relay.reshape(relay.transpose(y, (0, 1, 3, 2)), (2, 5, 9, 56))
    data = RNG.integers(-100, 100, (2, 5, 9, 56)).astype(dtype)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=target)
    run = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    run.set_input("x", data)
    run.run()
    np.testing.assert_array_equal(run.get_output(0).numpy(), data * 3 + 1)
