"""Partition rules, candidate enumeration and toolchain resolution."""
from __future__ import annotations

import warnings

import pytest
import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp
from tvm.relay.op.contrib import get_pattern_table

from tvm_tcutils.collage import rules
from tvm_tcutils.collage.candidates import enumerate_candidates
from tvm_tcutils.collage.driver import prepare
from tvm_tcutils.collage.subgraph import IndexedGraph, bits
from tvm_tcutils.collage.toolchains import PACKAGE_TOOLCHAINS, TVM, Toolchain, available, known, resolve


def _graph(expr, *params):
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(list(params), expr)))
    return IndexedGraph(mod["main"])


def test_pattern_rule_matches_commuted_args_and_skips_wildcards():
    x = relay.var("x", shape=(1, 8))
    w = relay.const(tvm.nd.array(__import__("numpy").ones((8, 8), "float32")))
    dense = relay.nn.dense(x, w)
    out = relay.add(relay.const(1.0), dense)  # constant first: only a commuted match works
    graph = _graph(relay.nn.relu(out), x)
    pat = dfp.is_op("add")(dfp.is_op("nn.dense")(dfp.wildcard(), dfp.is_constant()), dfp.is_constant())
    cands = rules.PatternRule(pat, name="dense_add").candidates(graph, "t")
    assert len(cands) == 1
    assert graph.op_names(cands[0].mask) == ["nn.dense", "add"]


def test_predicate_rejects_and_raising_predicate_rejects():
    x = relay.var("x", shape=(2,))
    graph = _graph(relay.exp(relay.exp(x)), x)
    pat = dfp.is_op("exp")(dfp.wildcard())
    assert len(rules.PatternRule(pat, lambda e: True).candidates(graph, "t")) == 2
    assert rules.PatternRule(pat, lambda e: False).candidates(graph, "t") == []
    assert rules.PatternRule(pat, lambda e: 1 / 0).candidates(graph, "t") == []


def test_fusion_kind_rule_follows_tvm_fusion(small_conv):
    graph = IndexedGraph(small_conv["main"])
    cands = rules.FusionKindRule(max_depth=3).candidates(graph, "tvm")
    groups = {tuple(graph.op_names(c.mask)) for c in cands}
    assert ("nn.conv2d", "nn.bias_add", "nn.relu") in groups  # anchor + elementwise epilogue
    assert ("nn.conv2d", "add", "nn.relu") in groups
    # Never two anchors in one group, never deeper than asked.
    assert all(names.count("nn.conv2d") <= 1 for names in groups)
    assert all(graph.depth(c.mask) <= 3 for c in cands)
    assert ("nn.max_pool2d",) in groups


def test_only_valid_rejects_non_convex_and_deep():
    x = relay.var("x", shape=(2,))
    a = relay.exp(x)
    b = relay.negative(a)
    graph = _graph(relay.add(a, b), x)
    from tvm_tcutils.collage.candidates import Candidate

    valid = rules.OnlyValidRule(rules.UnionRule([]), max_depth=2)
    assert not valid.valid(graph, Candidate("t", 0b1010, "x"))  # exp + add, skipping negative
    assert not valid.valid(graph, Candidate("t", 0b1110, "x"))  # depth 3
    assert valid.valid(graph, Candidate("t", 0b0110, "x"))


def test_combine_rule_grows_adjacent_within_depth():
    x = relay.var("x", shape=(2,))
    y = x
    for _ in range(6):
        y = relay.exp(y)
    graph = _graph(y, x)
    base = rules.PatternRule(dfp.is_op("exp")(dfp.wildcard()))
    cands = rules.CombineRule(base, max_depth=3).candidates(graph, "t")
    sizes = sorted({bin(c.mask).count("1") for c in cands})
    assert sizes == [1, 2, 3, 6]
    assert len(cands) == 6 + 5 + 4 + 1  # every chain window of length 1..3, and the whole chain
    [whole] = [c for c in cands if c.label == rules.MAXIMAL]
    assert whole.mask == graph.covered_mask  # the greedy BYOC region, beyond the depth limit
    assert rules.OnlyValidRule(rules.UnionRule([]), max_depth=3).valid(graph, whole)


def conv_bias_relu_net():
    """conv2d + broadcast bias add + relu, the form DNNL's patterns expect, then a residual add."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = relay.var("data", shape=(1, 8, 8, 8))
    w = relay.const(rng.standard_normal((8, 8, 3, 3)).astype("float32"))
    b = relay.const(rng.standard_normal((1, 8, 1, 1)).astype("float32"))
    y = relay.nn.relu(relay.add(relay.nn.conv2d(x, w, padding=(1, 1), kernel_size=(3, 3), channels=8), b))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.add(y, x))))


def test_dnnl_pattern_table_candidates_are_composites(small_conv):
    # The residual add of small_conv is not a bias: DNNL's predicate rejects it.
    found = enumerate_candidates(IndexedGraph(prepare(small_conv)["main"]), [known()["dnnl"]])
    assert found and not any(c.composites for c in found)  # only single ops, through target.dnnl
    graph = IndexedGraph(prepare(conv_bias_relu_net())["main"])
    dnnl = known()["dnnl"]
    cands = enumerate_candidates(graph, [dnnl])
    labels = {c.label for c in cands}
    assert "dnnl.conv2d_bias_relu" in labels
    for cand in cands:
        assert cand.toolchain == "dnnl"
        assert cand.label.startswith(("dnnl.", "target.dnnl."))
        for label, inner in cand.composites:
            assert inner & ~cand.mask == 0 and label.startswith("dnnl.")


def test_enumeration_is_deterministic(small_conv):
    graph = IndexedGraph(prepare(small_conv)["main"])
    tcs = resolve(["tvm", "dnnl"])
    first = enumerate_candidates(graph, tcs)
    second = enumerate_candidates(IndexedGraph(prepare(small_conv)["main"]), tcs)
    assert [(c.toolchain, c.mask, c.label) for c in first] == [(c.toolchain, c.mask, c.label) for c in second]


def test_resolve_known_and_errors():
    assert [tc.name for tc in resolve("tvm")] == ["tvm"]
    assert [tc.name for tc in resolve("dnnl")] == ["tvm", "dnnl"]  # TVM is always the fallback
    with pytest.raises(ValueError, match="unknown toolchain 'nosuch'; available: .*tvm"):
        resolve("tvm,nosuch")
    with pytest.raises(TypeError, match="toolchains"):
        resolve(42)
    assert "tvm" in available() and "cutlass" in known()


def test_unavailable_toolchain_warns_by_default_and_errors_when_named():
    missing = Toolchain("ghost", "tcutils_ghost", pattern_table="tcutils_ghost")
    assert missing.availability() == (False, "no pattern table 'tcutils_ghost' is registered")
    with pytest.raises(ValueError, match="'ghost' is not available here .*; available: "):
        resolve([missing])
    needs = Toolchain("needs", "x", pattern_table="dnnl", requires=("no_such_module_xyz",))
    with pytest.raises(ValueError, match="needs the Python module no_such_module_xyz"):
        resolve(["tvm", needs])


def test_default_toolchains_leave_out_missing_ones_with_a_warning(monkeypatch):
    ghost = Toolchain("ghost", "tcutils_ghost", pattern_table="tcutils_ghost")
    monkeypatch.setitem(PACKAGE_TOOLCHAINS, "ghost", ghost)
    monkeypatch.setattr("tvm_tcutils.collage.toolchains.DEFAULT", ("tvm", "ghost"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = resolve()
    assert [tc.name for tc in chosen] == ["tvm"]
    assert any("'ghost' left out" in str(w.message) for w in caught)


def test_ort_needs_onnxruntime(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    ok, reason = PACKAGE_TOOLCHAINS["ort"].availability()
    assert not ok and "onnxruntime" in reason


def test_tvm_rule_covers_every_operator(mlp_model, small_conv):
    mod, params = mlp_model
    _check_covers(IndexedGraph(prepare(mod, params)["main"]))
    _check_covers(IndexedGraph(prepare(small_conv)["main"]))


def _check_covers(graph):
    cands = enumerate_candidates(graph, [TVM])
    covered = 0
    for cand in cands:
        if bin(cand.mask).count("1") == 1:
            covered |= cand.mask
    assert covered == graph.covered_mask
    assert all(graph.is_convex(c.mask) for c in cands)
    assert max(len(list(bits(c.mask))) for c in cands) > 1


@pytest.mark.parametrize("table", ["dnnl", "cutlass", "tensorrt", "arm_compute_lib", "clml", "bnns"])
def test_python_matcher_agrees_with_tvm_matcher(table, small_conv, mlp_model):
    """Our matcher (linear) accepts exactly what DFPattern.match (C++) accepts, on every node."""
    entries = get_pattern_table(table)
    graphs = [IndexedGraph(prepare(small_conv)["main"]), IndexedGraph(prepare(conv_bias_relu_net())["main"]),
              IndexedGraph(prepare(*mlp_model)["main"])]
    checked = 0
    for graph in graphs:
        for node in graph.nodes:
            if node.kind not in ("call", "tuple", "getitem"):
                continue
            for entry in entries:
                ours = rules.matched_nodes(entry[1], node.expr, graph)
                assert (ours is not None) == bool(entry[1].match(node.expr)), (table, entry[0], node.op_name)
                checked += ours is not None
    assert table in ("bnns", "clml", "arm_compute_lib") or checked > 0


def test_each_package_pattern_checks_the_claim_its_builder_checks():
    # Issue 23: a pattern's predicate and its codegen's check are one function, so what is claimed builds.
    from tvm_tcutils.collage import predicates
    from tvm_tcutils.collage.toolchains import blas, relay_to_onnx

    for name in ("ort", "openvino", "openvino-bf16"):
        table = PACKAGE_TOOLCHAINS[name].pattern_table
        entries = get_pattern_table(table)
        if entries is None:
            continue  # not installed here
        assert entries and all(entry[2] is relay_to_onnx.supported for entry in entries), name
    entries = get_pattern_table(blas.COMPILER)
    assert {entry[2].__name__ for entry in entries} == {f"blas_claims[{op}]" for op in predicates.MATRIX_PRODUCTS}
    x, r, w = relay.var("x", shape=(3, 8)), relay.var("r", shape=(3, 4)), relay.const([[1.0] * 8] * 4)
    residual = _graph(relay.add(relay.nn.relu(r), relay.nn.dense(x, w)), x, r)
    bias_first = _graph(relay.add(relay.const([0.5] * 4), relay.nn.dense(x, w)), x)
    for graph, claimed in ((residual, False), (bias_first, True)):
        root = graph.nodes[-1].expr
        assert all(bool(entry[2](root)) == claimed for entry in entries if entry[0] == "tcutils_blas.dense_bias")
        assert predicates.blas_claims(root) == claimed  # what the codegen asserts


def _qdq_residual_block(end_in_quantize: bool = True):
    """x(u8) -> dq -> conv(dq(w)) -> bias -> relu -> add(dq(skip)) -> [quantize]: a QDQ layer with a residual."""
    import numpy as np

    scale, zero = relay.const(0.05), relay.const(0)
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="uint8")
    skip = relay.var("skip", shape=(1, 4, 6, 6), dtype="uint8")
    weight = relay.qnn.op.dequantize(relay.const(np.ones((4, 4, 3, 3), "int8")), scale, zero)
    conv = relay.nn.conv2d(relay.qnn.op.dequantize(x, scale, zero), weight, padding=(1, 1))
    y = relay.nn.relu(relay.nn.bias_add(conv, relay.const(np.ones(4, "float32"))))
    y = relay.add(y, relay.qnn.op.dequantize(skip, scale, zero))
    if end_in_quantize:
        y = relay.qnn.op.quantize(y, scale, zero, out_dtype="uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x, skip], y))
    return IndexedGraph(relay.transform.InferType()(mod)["main"])


def test_quantized_region_takes_the_layer_whole_with_its_residual_dequantize():
    graph = _qdq_residual_block()
    (cand,) = rules.QuantizedRegionRule().candidates(graph, "tvm")
    assert sorted(graph.op_names(cand.mask)) == sorted(
        ["qnn.dequantize"] * 3 + ["nn.conv2d", "nn.bias_add", "nn.relu", "add", "qnn.quantize"])
    assert cand.label == rules.QUANTIZED and graph.depth(cand.mask) > TVM.max_depth
    # TVM's rule offers it past its depth limit (its fusion kinds never group qnn ops).
    tvm_cands = enumerate_candidates(graph, [TVM])
    assert any(c.mask == cand.mask and c.label == rules.QUANTIZED for c in tvm_cands)
    assert not any(c.label == "tvm.fused" and "qnn.quantize" in graph.op_names(c.mask)
                   and "nn.conv2d" in graph.op_names(c.mask) for c in tvm_cands)


def test_no_quantized_region_without_a_final_quantize():
    assert rules.QuantizedRegionRule().candidates(_qdq_residual_block(end_in_quantize=False), "tvm") == []
