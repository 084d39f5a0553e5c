"""One float32 batch of products by one kernel parallel over its batches (``tvm_tcutils.float_batch_matmul``)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_tcutils
from tvm_tcutils import float_batch_matmul as fbm
from tvm_tcutils import registry

from conftest import DOT_TARGETS, dot_target


def _run(target: str, shape_x, shape_y, transpose_a: bool, transpose_b: bool, seed: int = 0):
    x, y = relay.var("x", shape=shape_x), relay.var("y", shape=shape_y)
    mod = tvm.IRModule.from_expr(relay.Function([x, y], fbm.make(x, y, transpose_a, transpose_b)))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(shape_x).astype("float32"), rng.standard_normal(shape_y).astype("float32")
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(x=a, y=b)
    runner.run()
    want = np.matmul(a.transpose(0, 2, 1) if transpose_a else a, b.transpose(0, 2, 1) if transpose_b else b)
    return lib, runner.get_output(0).numpy(), want


@pytest.mark.parametrize("isa", sorted(set(DOT_TARGETS) - {"vnni_zen5"}))
@pytest.mark.parametrize("shape_x, shape_y, transpose_a, transpose_b", [
    ((12, 128, 64), (12, 128, 64), False, True),  # BERT-base's scores
    ((12, 128, 128), (12, 128, 64), False, False),  # its context
    ((3, 13, 32), (3, 48, 32), False, True),  # rows no block divides
    ((2, 40, 7), (2, 40, 16), True, False),  # one vector of columns, transposed data
    ((1, 18, 24), (4, 24, 32), False, False),  # data broadcast over the batch
    ((4, 12, 24), (1, 64, 24), False, True),  # weights broadcast
])
def test_products_equal_numpy(isa, shape_x, shape_y, transpose_a, transpose_b):
    _, got, want = _run(dot_target(isa), shape_x, shape_y, transpose_a, transpose_b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_kernel_is_one_parallel_launch_of_fused_vector_products():
    target = dot_target("vnni")
    lib, _, _ = _run(target, (12, 128, 64), (12, 128, 64), False, True)
    kernels = [f for f in lib.function_metadata if "float_batch_matmul" in f]
    assert len(kernels) == 1, list(lib.function_metadata)
    llvm_ir = lib.get_lib().get_source("ll")
    assert llvm_ir.count("TVMBackendParallelLaunch") >= 1
    asm = lib.get_lib().get_source("asm")
    # Rows x two vectors of accumulators over the reduction: packed fused multiply-adds on zmm registers
    # with the data broadcast from memory, not a horizontal reduction per output.
    assert "vfmadd231ps" in asm and "zmm" in asm, asm[:2000]
    assert "{1to16}" in asm or "vbroadcastss" in asm
    assert "vhaddps" not in asm and "vextractf" not in asm


@pytest.mark.parametrize("target, expected", [
    ("llvm -mcpu=skylake-avx512", 16), ("llvm -mcpu=haswell", 8), ("llvm -mcpu=nehalem", 4),
    ("llvm -mcpu=x86-64", None), ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon", None), ("cuda", None),
])
def test_lanes_follow_the_target(target, expected):
    assert fbm.lanes(tvm.target.Target(target)) == expected


def test_applies_only_where_columns_fill_vectors():
    t = tvm.target.Target("llvm -mcpu=skylake-avx512")
    assert fbm.applies((2, 8, 4), (2, 32, 4), False, True, t)
    assert not fbm.applies((2, 8, 4), (2, 24, 4), False, True, t)  # 24 columns: not whole 16-lane vectors
    assert fbm.applies((2, 8, 4), (2, 24, 4), False, True, tvm.target.Target("llvm -mcpu=haswell"))
    assert not fbm.applies((2, 8, 4), (2, 32, 5), False, True, t)  # reductions differ
    assert not fbm.applies((2, 8, 4), (2, 32, 4), False, True, None)


@pytest.mark.parametrize("shape_x, shape_y, dtype, match", [
    ((2, 8, 4), (2, 16, 5), "float32", "do not multiply"),
    ((2, 8, 4), (3, 16, 4), "float32", "do not multiply"),
    ((8, 4), (16, 4), "float32", "two 3-d float32"),
    ((2, 8, 4), (2, 16, 4), "float16", "two 3-d float32"),
])
def test_type_relation_names_bad_operands(shape_x, shape_y, dtype, match):
    x, y = relay.var("x", shape=shape_x, dtype=dtype), relay.var("y", shape=shape_y, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, y], fbm.make(x, y))))


def test_unregister_takes_the_kernels_away_and_register_gives_them_back():
    x, y = relay.var("x", shape=(2, 8, 4)), relay.var("y", shape=(2, 16, 4))
    mod = tvm.IRModule.from_expr(relay.Function([x, y], fbm.make(x, y)))
    op = tvm.ir.Op.get(fbm.OP_NAME)
    try:
        tvm_tcutils.unregister()
        assert op.get_attr("FTVMStrategy") is None and op.get_attr("TOpPattern") is None
        with pytest.raises(ValueError, match="not registered now"):
            relay.transform.InferType()(mod)
    finally:
        tvm_tcutils.register()
    assert op.get_attr("TOpPattern") == 8
    relay.transform.InferType()(mod)


def test_a_relay_op_someone_else_registered_is_an_error():
    reg = registry.Registry()
    reg.add(registry.relay_op("nn.dense", ("x",), lambda types, attrs: types[0], "DictAttrs", 8))
    with pytest.raises(ValueError, match="'nn.dense' is already registered by someone else"):
        reg.register()
