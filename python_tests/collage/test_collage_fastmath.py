"""The ``tvm-fastmath`` toolchain: TVM's FastMath rewrite on what Collage leaves to TVM, nowhere else."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.collage import MockCostEstimator, build_partitioned, partition, resolve, tvm_toolchain
from tvm_tcutils.collage.cost.base import cost_requests
from tvm_tcutils.collage.candidates import enumerate_candidates
from tvm_tcutils.collage.subgraph import IndexedGraph
from tvm_tcutils.collage.toolchains import PACKAGE_TOOLCHAINS, TVM, TVM_FASTMATH

from conftest import build_and_run, op_names

#: Each operator FastMath rewrites, and what it becomes.
_REWRITTEN = {"erf": "fast_erf", "exp": "fast_exp", "tanh": "fast_tanh", "nn.softmax": "nn.fast_softmax"}


def _op_names(func) -> set:
    return set(op_names(func))


def gelu_softmax_block(seq: int = 16, hidden: int = 32):
    """dense -> GELU (erf) -> dense -> softmax, tanh: every operator FastMath rewrites."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(seq, hidden))
    w1 = relay.const((rng.standard_normal((4 * hidden, hidden)) / np.sqrt(hidden)).astype("float32"))
    w2 = relay.const((rng.standard_normal((hidden, 4 * hidden)) / np.sqrt(4 * hidden)).astype("float32"))
    h = relay.nn.dense(x, w1)
    gelu = relay.multiply(relay.multiply(h, relay.add(relay.erf(relay.divide(h, relay.const(np.sqrt(2.0), "float32"))),
                                                      relay.const(1.0))), relay.const(0.5))
    y = relay.nn.softmax(relay.nn.dense(gelu, w2), axis=-1)
    out = relay.add(relay.tanh(y), relay.exp(relay.negative(y)))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def test_rewrite_only_for_fastmath_and_only_tvm_functions():
    mod = gelu_softmax_block()
    assert tvm.ir.structural_equal(TVM.rewrite(mod), mod)
    fast = TVM_FASTMATH.rewrite(mod)
    names = _op_names(fast["main"])
    assert set(_REWRITTEN.values()) <= names, names
    assert not set(_REWRITTEN) & names, names
    assert tvm.ir.structural_equal(mod, gelu_softmax_block())  # the input is not mutated


def test_resolve_allows_one_tvm_toolchain_to_lower_main():
    import dataclasses

    assert [tc.name for tc in resolve("tvm-fastmath")] == ["tvm-fastmath"]
    assert tvm_toolchain(resolve("tvm-fastmath")).fast_math
    assert tvm_toolchain([PACKAGE_TOOLCHAINS["blas"]]) is TVM
    # Beside tvm, the fast-math mode is a choice per partition; tvm lowers main.
    assert [tc.name for tc in resolve("tvm-fastmath,tvm")] == ["tvm", "tvm-fastmath"]
    assert tvm_toolchain(resolve("tvm-fastmath,tvm")) is TVM
    with pytest.raises(ValueError, match=r"at most one TVM toolchain lowers main.*'tvm', 'tvm2'"):
        resolve(["tvm", dataclasses.replace(TVM, name="tvm2")])


def test_measured_candidates_are_rewritten_and_keyed_apart():
    mod = gelu_softmax_block()
    graph = IndexedGraph(mod["main"])
    toolchains = {tc.name: tc for tc in (TVM, TVM_FASTMATH)}
    cands = enumerate_candidates(graph, list(toolchains.values()))
    erf_node = next(i for i in range(len(graph.nodes)) if graph.op_names(1 << i) == ["erf"])
    singles = {c.toolchain: k for k, c in enumerate(cands) if c.mask == 1 << erf_node and not c.host}
    assert set(singles) == {"tvm", "tvm-fastmath"}
    plain, fast = cost_requests(graph, cands, [singles["tvm"], singles["tvm-fastmath"]], toolchains)
    assert "erf" in _op_names(plain.module["main"]) and "fast_erf" not in _op_names(plain.module["main"])
    assert "fast_erf" in _op_names(fast.module["main"])
    assert plain.ops == fast.ops == ["erf"]  # costs tables stay by the graph's operators
    assert plain.key != fast.key


def test_partition_rewrites_main_only_and_matches_tvm():
    mod = gelu_softmax_block()
    costs = MockCostEstimator({"tvm-fastmath": 1.0, "ort": {"erf": 0.1, "*": 5.0}}, overhead={"ort": 0.1})
    names = ["tvm-fastmath"]
    ort = PACKAGE_TOOLCHAINS["ort"]
    use_ort = ort.availability()[0] and ort.buildable()
    if use_ort:
        names.append("ort")
    result = partition(mod, None, names, costs, validate_rounds=0)
    assert "tvm-fastmath" in result.single_toolchain_ms
    main_ops = _op_names(result.mod["main"])
    assert {"nn.fast_softmax", "fast_tanh", "fast_exp"} <= main_ops, main_ops
    assert not {"erf", "exp", "tanh", "nn.softmax"} & main_ops, main_ops
    if use_ort:  # erf went to onnxruntime, unrewritten (the ONNX converter knows erf, not fast_erf)
        ort_funcs = [result.mod[p.function] for p in result.partitions if p.toolchain == "ort"]
        assert ort_funcs and all("erf" in _op_names(f) for f in ort_funcs)
    data = np.random.default_rng(1).standard_normal((16, 32)).astype("float32")
    lib = build_partitioned(result.mod)
    from tvm.contrib import graph_executor

    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input("x", data)
    runner.run()
    (expected,) = build_and_run(mod, inputs={"x": data})
    # FastMath's approximations: about 1e-6 absolute on these values.
    np.testing.assert_allclose(runner.get_output(0).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_greedy_partition_lowers_its_tvm_rest_as_asked():
    from tvm_tcutils.collage.driver import greedy_partition

    mod = gelu_softmax_block()
    plain = greedy_partition(mod, None, "blas")
    fast = greedy_partition(mod, None, "blas", TVM_FASTMATH)
    assert {"erf", "nn.softmax"} <= _op_names(plain["main"])
    assert {"fast_erf", "nn.fast_softmax"} <= _op_names(fast["main"])
    assert not {"erf", "nn.softmax"} & _op_names(fast["main"])
    blas_funcs = [gv.name_hint for gv in fast.get_global_vars() if gv.name_hint != "main"]
    assert blas_funcs and all(tvm.ir.structural_equal(fast[name], plain[name]) for name in blas_funcs)
