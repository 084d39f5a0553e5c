"""outline_annotated: BYOC's PartitionGraph in linear time, checked against TVM's pass as the oracle.

TVM's pass re-infers the whole module after each region it outlines (395 s for BERT-base's 361
onnxruntime regions); the package's outliner must give the same partitions: the same functions (in the
order main calls them, names aside) and the same main.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import small_conv_net
from tvm_tcutils.collage import driver
from tvm_tcutils.collage.outline import _children, _post_order, outline_annotated
from tvm_tcutils.collage.toolchains import resolve


def _externals(mod: tvm.IRModule) -> list:
    found = []
    for node in _post_order(mod["main"].body, _children):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.GlobalVar) and node.op not in found:
            found.append(node.op)
    return found


def _main_shape(mod: tvm.IRModule, externals: list) -> list:
    index = {gv: i for i, gv in enumerate(externals)}
    shape = []
    for node in _post_order(mod["main"].body, _children):
        if isinstance(node, relay.Call):
            shape.append(("call", index[node.op]) if node.op in index else (str(node.op), str(node.checked_type)))
        elif isinstance(node, relay.TupleGetItem):
            shape.append(("item", node.index))
        elif isinstance(node, relay.Tuple):
            shape.append(("tuple", len(node.fields)))
    return shape


def _assert_same_as_tvm(annotated: tvm.IRModule) -> int:
    mine = outline_annotated(annotated)
    theirs = relay.transform.PartitionGraph()(annotated)
    ours, tvms = _externals(mine), _externals(theirs)
    assert len(ours) == len(tvms)
    for a, b in zip(ours, tvms):
        fa, fb = mine[a], theirs[b]
        assert fa.attrs["Compiler"] == fb.attrs["Compiler"] and a.name_hint.startswith("tvmgen_default_")
        assert tvm.ir.structural_equal(relay.Function(fa.params, fa.body, fa.ret_type),
                                       relay.Function(fb.params, fb.body, fb.ret_type), map_free_vars=True), a
    assert _main_shape(mine, ours) == _main_shape(theirs, tvms)
    return len(ours)


def _annotated(mod: tvm.IRModule, toolchain: str) -> tvm.IRModule:
    (tc,) = [t for t in resolve([toolchain]) if not t.is_tvm]
    entries = driver._matchable(list(tc.patterns or ()) + list(
        (relay.op.contrib.get_pattern_table(tc.pattern_table) or []) if tc.pattern_table else []), mod)
    seq = ([relay.transform.MergeComposite(entries)] if entries else []) + [
        relay.transform.AnnotateTarget(tc.compiler), relay.transform.MergeCompilerRegions()]
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(seq)(mod)


@pytest.mark.parametrize("model, toolchain", [("mlp", "dnnl"), ("conv", "ort"), ("conv", "openvino"),
                                              ("conv", "dnnl")])
def test_the_same_partitions_as_tvms_pass(mlp_model, model, toolchain):
    mod = driver.prepare(*mlp_model) if model == "mlp" else driver.prepare(small_conv_net(), {})
    assert _assert_same_as_tvm(_annotated(mod, toolchain)) >= 1


def test_shared_outputs_constants_and_chained_regions_as_tvm_outlines_them():
    """A region whose output is read twice outside (one output, not two), a constant input (bound inside),
    a region that reads another's outputs, and an operator between regions."""
    def begin(e):
        return relay.annotation.compiler_begin(e, "ccompiler")

    def end(e):
        return relay.annotation.compiler_end(e, "ccompiler")

    x = relay.var("x", shape=(4, 4))
    weight = relay.const(np.arange(16, dtype="float32").reshape(4, 4))
    first = relay.add(begin(x), begin(weight))
    second = relay.multiply(first, first)
    a, b = end(first), end(second)
    between = relay.exp(a)  # not in a region
    third = relay.subtract(begin(b), begin(end(first)))
    out = relay.Tuple([between, end(relay.abs(third)), relay.log(a)])
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))
    assert _assert_same_as_tvm(mod) == 2
    outlined = outline_annotated(mod)
    first_region = outlined[_externals(outlined)[0]]
    assert len(first_region.params) == 1  # x; the weight is bound inside
    assert len(first_region.ret_type.fields) == 2  # first (read three times) and second, each once


def test_the_input_module_is_not_changed():
    mod = driver.prepare(small_conv_net(), {})
    annotated = _annotated(mod, "ort")
    before = tvm.ir.load_json(tvm.ir.save_json(annotated))
    outline_annotated(annotated)
    assert tvm.ir.structural_equal(annotated, before)
