"""recast: TVM's recast as the oracle, numbering, numerics, bad input."""
import functools
import random

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.relay.analysis import count_layers as tvm_count_layers
from tvm.relay.transform import recast as tvm_recast

from conftest import build_and_run, conv_chain, small_conv_net
from tvm_tcutils import count_layers, layer_table, load_model, recast
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


def _oracle_params():
    """Each model's skip lists with int8 and int4 taking turns by default (every model, every skip list and
    both dtypes on each model); the other dtype of each skip list under -m slow."""
    params = []
    for name, skip_lists in ORACLE_CASES:
        params.append(pytest.param(name, skip_lists, 0, id=name))
        params.append(pytest.param(name, skip_lists, 1, id=f"{name}-other-dtype", marks=pytest.mark.slow))
    return params


@pytest.mark.parametrize("name, skip_lists, turn", _oracle_params())
def test_structurally_equal_to_tvm_recast(name, skip_lists, turn):
    mod, _ = model(name)
    dtypes = (("int8", "int32"), ("int4", "int32"))
    for index, skip in enumerate(skip_lists):
        for dtype, out_dtype in [dtypes[(index + turn) % 2]]:
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


def _bit_sets(count):
    """Skip lists that tell every pair of indices below ``count`` apart (index i is in list b iff bit b of i is 1)."""
    return [[i for i in range(count) if i >> bit & 1] for bit in range(max(count - 1, 1).bit_length())]


@pytest.mark.parametrize("name", ["resnet-18", "squeezenet1.1"])
def test_tvm_numbering_returns_what_tvm_recast_returns(name):
    # The bit sets check every layer's index with a few of TVM's (slow) recasts.
    mod, _ = model(name)
    count = tvm_count_layers(mod, ["nn.conv2d"])
    for skip in [[], [-1], *_bit_sets(count)]:
        ours = recast(mod, "int8", "int32", skip_layers=skip, numbering="tvm")
        theirs = tvm_recast(mod, "int8", "int32", skip_layers=list(skip))
        assert tvm.ir.structural_equal(ours, theirs), (name, skip)


def parallel_graphs():
    """{name: (function, ops)}: graphs whose TVM numbering hangs on operand order and first visits."""
    x, w = relay.var("x", shape=(1, 4, 8, 8)), relay.var("w", shape=(4, 4, 3, 3))

    def conv(data):
        return relay.nn.conv2d(data, w, padding=(1, 1))

    stem = conv(x)
    long, short = conv(conv(stem)), conv(stem)
    a, b, c, d, e = (relay.var(name, shape=(2, 2)) for name in "abcde")
    deep = relay.add(relay.add(c, d), e)
    bodies = {
        "long branch first": (relay.add(long, short), ["nn.conv2d"]),
        "short branch first": (relay.add(short, long), ["nn.conv2d"]),
        "shared layer reached first by the short path": (relay.add(stem, conv(conv(stem))), ["nn.conv2d"]),
        "concatenated branches": (relay.concatenate([short, long, stem], axis=1), ["nn.conv2d", "concatenate"]),
        "layers in both operands of a layer": (relay.add(relay.add(a, b), deep), ["add"]),
        "deeper in the first operand": (relay.add(deep, relay.add(a, b)), ["add"]),
        "no layer": (relay.nn.relu(x), ["nn.conv2d"]),
    }
    return {name: (relay.Function(relay.analysis.free_vars(body), body), ops) for name, (body, ops) in bodies.items()}


@pytest.mark.parametrize("name", list(parallel_graphs()))
def test_tvm_numbering_on_parallel_layers(name):
    function, ops = parallel_graphs()[name]
    dtype = "int8" if ops[0] == "nn.conv2d" else "float16"
    count = tvm_count_layers(function, ops)
    assert count_layers(function, ops, numbering="tvm") == count
    for skip in [[], *([i] for i in range(count)), *_bit_sets(count)]:
        ours = recast(function, dtype, "int32", ops=ops, skip_layers=skip, numbering="tvm")
        theirs = tvm_recast(function, dtype, "int32", ops=ops, skip_layers=list(skip))
        assert tvm.ir.structural_equal(ours, theirs), (skip, ours, theirs)
        # layer_table names the layers recast skips
        rows = layer_table(function, ops, numbering="tvm")
        kept = [row.index in skip for row in rows]
        assert kept == [not cast for cast in _layers_cast(ours, ops, dtype)]


def _layers_cast(expr, ops, dtype):
    """Per layer call in dataflow order: whether its first input is cast to ``dtype``."""
    found = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in ops:
            arg = node.args[0]
            arg = arg.fields[0] if isinstance(arg, relay.Tuple) else arg
            found.append(isinstance(arg, relay.Call) and arg.op.name == "cast" and str(arg.attrs.dtype) == dtype)

    relay.analysis.post_order_visit(expr, visit)
    return found


@pytest.mark.parametrize("kind", ["function", "expression", "module", "typed module"])
def test_output_types_are_those_of_tvm_recast(kind):
    # Untyped in, untyped out (no ret_type added), as TVM's recast; typed in, typed out.
    def make():
        x, w, p = relay.var("x", shape=(1, 4, 8, 8)), relay.var("w", shape=(4, 4, 3, 3)), relay.var("p", shape=(1, 4, 8, 8))
        inner = relay.Function([p], relay.nn.relu(relay.nn.conv2d(p, w, padding=(1, 1))))
        body = relay.nn.conv2d(relay.Call(inner, [x]), w, padding=(1, 1))
        function = relay.Function([x, w], body)
        made = {"function": function, "expression": body, "module": tvm.IRModule.from_expr(function)}
        return made.get(kind) or _typed(tvm.IRModule.from_expr(function))

    ours = recast(make(), "int8", "int32", numbering="tvm")
    theirs = tvm_recast(make(), "int8", "int32")
    assert tvm.ir.structural_equal(ours, theirs, map_free_vars=True)
    main = ours["main"] if isinstance(ours, tvm.IRModule) else ours
    if kind in ("function", "module"):
        assert main.ret_type is None
    if kind == "typed module":
        assert main.ret_type is not None


def test_a_module_typed_only_at_its_main_function():
    # InferType leaves a type on the Function node of the module it is given, none on its body.
    mod = conv_chain(3)
    relay.transform.InferType()(mod)
    assert _casted_layers(recast(mod, "int8", "int32", skip_layers=[1]), "int8") == [0, 2]


def test_tvm_numbering_recasts_main_only_and_keeps_the_other_functions():
    main = small_conv_net()["main"]
    mod = tvm.IRModule({"main": main, "other": main})
    out = recast(mod, "int8", "int32", skip_layers=[0], numbering="tvm")
    assert _casted_layers(out, "int8") == [1]
    assert out["other"].same_as(mod["other"])
    assert tvm.ir.structural_equal(out["main"], tvm_recast(mod, "int8", "int32", skip_layers=[0])["main"])


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
        (dict(numbering="depth"), ValueError, "numbering: 'depth' is not a layer numbering; valid: 'chain', 'tvm'"),
        (dict(numbering=None), TypeError, "numbering must be one of 'chain', 'tvm'"),
        (dict(numbering="tvm", skip_layers=[2]), ValueError, r"skip_layers: layer 2 is out of range"),
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


def _random_graph(rng, size=16):
    """A random graph of adds, multiplies, relus, tuples and called functions: TVM's numbering's corner cases."""
    nodes = [relay.var(f"v{i}", shape=(2, 2)) for i in range(3)]
    for _ in range(size):
        a, b = rng.choice(nodes), rng.choice(nodes)
        p = relay.var("p", shape=(2, 2))
        nodes.append(rng.choice([
            lambda: relay.add(a, b),
            lambda: relay.multiply(a, b),
            lambda: relay.Tuple([a, b, rng.choice(nodes)])[rng.randrange(3)],
            lambda: relay.nn.relu(a),
            lambda: relay.Call(relay.Function([p], relay.add(relay.nn.relu(p), p)), [a]),
        ])())
    out = relay.Tuple([nodes[-1], rng.choice(nodes[3:])])
    return relay.Function(relay.analysis.free_vars(out), out)


def test_tvm_numbering_on_random_graphs():
    rng = random.Random(7)
    for _ in range(12):
        function = _random_graph(rng)
        for ops in (["add"], ["add", "nn.relu"]):
            count = tvm_count_layers(function, ops)
            assert count_layers(function, ops, numbering="tvm") == count
            for skip in [[], *_bit_sets(count)]:
                ours = recast(function, "float16", "float16", ops=ops, skip_layers=skip, numbering="tvm")
                theirs = tvm_recast(function, "float16", "float16", ops=ops, skip_layers=skip)
                assert tvm.ir.structural_equal(ours, theirs), (ops, skip, function)
