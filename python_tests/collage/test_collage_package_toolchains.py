"""Collage with the package's own ort and blas toolchains, built and run end to end (when installed)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from tvm_tcutils.collage import MockCostEstimator, build_partitioned, partition
from tvm_tcutils.collage.toolchains import PACKAGE_TOOLCHAINS


def _need(name):
    tc = PACKAGE_TOOLCHAINS[name]
    ok, reason = tc.availability()
    if not ok or not tc.buildable():
        pytest.skip(f"toolchain {name} not installed here: {reason or 'no codegen'}")
    return tc


def attention_block():
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(16, 32))
    w = relay.const(rng.standard_normal((32, 32)).astype("float32") * 0.2)
    q = relay.nn.dense(x, w)
    scores = relay.nn.batch_matmul(relay.expand_dims(q, 0), relay.expand_dims(x, 0))
    probs = relay.nn.softmax(scores, axis=-1)
    out = relay.nn.batch_matmul(probs, relay.expand_dims(relay.transpose(x), 0))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.tanh(out))))


@pytest.mark.parametrize("names", [("ort",), ("blas",), ("ort", "blas")])
def test_partition_builds_and_matches_tvm(names):
    for name in names:
        _need(name)
    mod = attention_block()
    costs = MockCostEstimator({"tvm": 1.0, "ort": 0.4, "blas": 0.3}, overhead={"ort": 0.2, "blas": 0.1})
    result = partition(mod, None, ["tvm", *names], costs)
    used = {p.toolchain for p in result.partitions}
    assert used & set(names), result.partitions
    for row in result.partitions:
        if row.toolchain != "tvm":
            func = result.mod[row.function]
            assert func.attrs["Compiler"] == PACKAGE_TOOLCHAINS[row.toolchain].compiler
    lib = build_partitioned(result.mod)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    data = np.random.default_rng(1).standard_normal((16, 32)).astype("float32")
    runner.set_input("x", data)
    runner.run()
    expected = relay.create_executor("graph", mod=mod, target="llvm").evaluate()(data).numpy()
    np.testing.assert_allclose(runner.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-5)
