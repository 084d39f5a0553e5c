"""recast: TVM's recast as the oracle, numbering, numerics, bad input."""
import functools

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.relay.transform import recast as tvm_recast

from conftest import build_and_run, conv_chain, small_conv_net
from tvm_tcutils import count_layers, load_model, recast
from tvm_tcutils.models import random_inputs


@functools.lru_cache(maxsize=None)
def model(name):
    if name == "chain":
        return relay.transform.InferType()(conv_chain(12)), {}
    return load_model(name)


def _typed(mod):
    return relay.transform.InferType()(mod)


# Skip lists on which TVM's numbering agrees with ours. TVM numbers a layer by
# the longest chain of layers after it, so parallel layers share an index; the
# lists avoid the layers after the first parallel branch (see the test below).
ORACLE_CASES = [
    ("chain", [[], [0], [0, 1, 2], [-1], [-1, -3], [2, 5]]),
    ("mobilenet", [[], [0], [0, 1, 2], [-1, -2], [4, 10, -5]]),
    ("resnet-18", [[], [0], [0, 1], [-1], [-1, -2]]),
    ("squeezenet1.1", [[], [0], [0, 1], [-1]]),
]


@pytest.mark.parametrize("name, skip_lists", ORACLE_CASES, ids=[case[0] for case in ORACLE_CASES])
def test_structurally_equal_to_tvm_recast(name, skip_lists):
    mod, _ = model(name)
    for skip in skip_lists:
        for dtype, out_dtype in (("int8", "int32"), ("int4", "int32")):
            ours = _typed(recast(mod, dtype, out_dtype, skip_layers=skip))
            theirs = _typed(tvm_recast(mod, dtype, out_dtype, skip_layers=list(skip)))
            assert tvm.ir.structural_equal(ours, theirs), (name, skip, dtype)


def test_other_ops_match_tvm_too():
    mod, _ = model("squeezenet1.1")
    for ops in (["nn.relu"], ["nn.conv2d", "nn.relu"]):
        ours = _typed(recast(mod, "float16", "float16", ops=ops, skip_layers=[0]))
        theirs = _typed(tvm_recast(mod, "float16", "float16", ops=ops, skip_layers=[0]))
        assert tvm.ir.structural_equal(ours, theirs), ops


def _casted_layers(mod, dtype):
    """Indices (in layer order) of the conv2d layers whose data input is cast to ``dtype``."""
    found = []

    def visit(node):
        if isinstance(node, relay.Call) and node.op == relay.op.get("nn.conv2d"):
            arg = node.args[0]
            found.append(isinstance(arg, relay.Call) and arg.op == relay.op.get("cast") and arg.attrs.dtype == dtype)

    relay.analysis.post_order_visit(mod["main"], visit)
    return [i for i, cast in enumerate(found) if cast]


def test_every_parallel_layer_has_its_own_index():
    # resnet-18: layer 3 is the first shortcut conv, parallel to layers 1-2.
    mod, _ = model("resnet-18")
    total = count_layers(mod, ["nn.conv2d"])
    ours = recast(mod, "int8", "int32", skip_layers=[3])
    assert _casted_layers(ours, "int8") == [i for i in range(total) if i != 3]
    # TVM's recast numbers by depth: its "layer 2" is both layer 2 and the shortcut conv 3.
    theirs = _typed(tvm_recast(mod, "int8", "int32", skip_layers=[2]))
    assert _casted_layers(theirs, "int8") == [i for i in range(total) if i not in (2, 3)]


def test_negative_indices_count_from_the_last_layer():
    mod, _ = model("resnet-18")
    total = count_layers(mod, ["nn.conv2d"])
    a = recast(mod, "int8", "int32", skip_layers=[-1, -total])
    b = recast(mod, "int8", "int32", skip_layers=[total - 1, 0])
    assert tvm.ir.structural_equal(_typed(a), _typed(b))
    assert _casted_layers(a, "int8") == list(range(1, total - 1))


def test_same_kind_as_input_and_input_unchanged():
    mod = small_conv_net()
    before = tvm.ir.save_json(mod)
    out_mod = recast(mod, "int8", "int32")
    out_fn = recast(mod["main"], "int8", "int32")
    out_body = recast(mod["main"].body, "int8", "int32")
    assert tvm.ir.save_json(mod) == before
    assert isinstance(out_mod, tvm.IRModule)
    assert isinstance(out_fn, relay.Function)
    assert isinstance(out_body, relay.Expr) and not isinstance(out_body, relay.Function)
    assert tvm.ir.structural_equal(_typed(out_mod)["main"], _typed(tvm.IRModule.from_expr(out_fn))["main"])
    # the rest of the graph is unchanged: the output type is the original one
    assert _typed(out_mod)["main"].ret_type == mod["main"].ret_type


def test_every_function_of_a_module_is_recast():
    main = small_conv_net()["main"]
    mod = tvm.IRModule({"main": main, "other": main})
    out = recast(mod, "int8", "int32", skip_layers=[-1])
    assert _casted_layers(out, "int8") == [0, 1]
    found = []
    relay.analysis.post_order_visit(
        out["other"], lambda n: isinstance(n, relay.Call) and n.op == relay.op.get("cast") and found.append(n)
    )
    assert len(found) == 3  # layer 2 recast (data, weight, result), layer 3 skipped


def test_concatenate_tuple_fields_are_cast_and_output_type_kept():
    a, b = relay.var("a", shape=(1, 2, 4, 4)), relay.var("b", shape=(1, 3, 4, 4))
    mod = _typed(tvm.IRModule.from_expr(relay.Function([a, b], relay.concatenate([a, b], axis=1))))
    out = _typed(recast(mod, "float16", "float16", ops=["concatenate"]))
    theirs = _typed(tvm_recast(mod, "float16", "float16", ops=["concatenate"]))
    assert tvm.ir.structural_equal(out, theirs)
    assert out["main"].ret_type == mod["main"].ret_type


def test_numerics_follow_the_cast():
    # Recasting to float64 keeps the results (up to float32 rounding of the result).
    mod = small_conv_net(channels=8)
    inputs = random_inputs(mod)
    expected = build_and_run(mod, inputs=inputs)[0]
    wide = recast(mod, "float64", "float64", ops=["nn.conv2d", "add"])
    np.testing.assert_allclose(build_and_run(wide, inputs=inputs)[0], expected, rtol=1e-5, atol=1e-5)
    # int8 inputs really are truncated: the output changes, and matches numpy's truncation on one conv.
    x = relay.var("x", shape=(1, 2, 4, 4))
    w = np.arange(-9, 9, dtype="float32").reshape(2, 1, 3, 3)[:, :1].repeat(2, axis=1)
    conv = relay.nn.conv2d(x, relay.const(w), padding=(1, 1), channels=2, kernel_size=(3, 3))
    one = _typed(tvm.IRModule.from_expr(relay.Function([x], conv)))
    data = np.linspace(-3.7, 3.7, 32, dtype="float32").reshape(1, 2, 4, 4)
    got = build_and_run(recast(one, "int8", "int32"), inputs={"x": data})[0]
    from tvm.topi.testing import conv2d_nchw_python

    want = conv2d_nchw_python(np.trunc(data).astype("int32"), w.astype("int32"), 1, 1).astype("float32")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(dtype="int3x"), ValueError, "dtype"),
        (dict(dtype="float33"), ValueError, "dtype"),
        (dict(out_dtype="banana"), ValueError, "out_dtype"),
        (dict(dtype=8), TypeError, "dtype"),
        (dict(ops=["nn.convolution"]), ValueError, "ops"),
        (dict(skip_layers=[2]), ValueError, r"skip_layers: layer 2 is out of range.*-2\.\.1"),
        (dict(skip_layers=[-3]), ValueError, "skip_layers"),
        (dict(skip_layers=[0.5]), TypeError, "skip_layers"),
        (dict(skip_layers=[True]), TypeError, "skip_layers"),
        (dict(skip_layers="0"), TypeError, "skip_layers"),
        (dict(skip_layers=3), TypeError, "skip_layers"),
    ],
)
def test_bad_input(kwargs, error, words):
    args = dict(dtype="int8", out_dtype="int32")
    args.update(kwargs)
    mod = small_conv_net()
    before = tvm.ir.save_json(mod)
    with pytest.raises(error, match=words):
        recast(mod, **args)
    assert tvm.ir.save_json(mod) == before


def test_module_that_does_not_type_check():
    x = relay.var("x", shape=(1, 3, 8, 8))
    bad = tvm.IRModule.from_expr(relay.nn.conv2d(x, relay.var("w", shape=(4, 5, 3, 3))))
    with pytest.raises(ValueError, match="does not type-check"):
        recast(bad, "int8", "int32")


def test_numpy_integers_are_indices():
    mod = conv_chain(4)
    a = recast(mod, "int8", "int32", skip_layers=[np.int64(1)])
    assert _casted_layers(a, "int8") == [0, 2, 3]


def test_ops_with_tuple_results_are_refused():
    x = relay.var("x", shape=(1, 4, 4, 4))
    mod = _typed(tvm.IRModule.from_expr(relay.Function([x], relay.split(x, 2, axis=1)[0])))
    with pytest.raises(ValueError, match="split returns .* not one tensor"):
        recast(mod, "float16", "float16", ops=["split"])
