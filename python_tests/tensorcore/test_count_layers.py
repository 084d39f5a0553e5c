"""count_layers and layer_table: numbering, oracles, bad input."""
import functools

import pytest
import tvm
from tvm import relay
from tvm.relay.analysis import count_layers as tvm_count_layers

from conftest import conv_chain, small_conv_net
from tvm_tcutils import count_layers, layer_table, load_model


@functools.lru_cache(maxsize=None)
def model(name):
    return load_model(name)[0]


def _text_count(mod, op):
    return mod.astext(show_meta_data=False).count(f" {op}(")


@pytest.mark.parametrize("name", ["chain", "mobilenet", "mlp"])
def test_matches_tvm_on_graphs_without_parallel_layers(name):
    mod = relay.transform.InferType()(conv_chain(40)) if name == "chain" else model(name)
    for ops in (["nn.conv2d"], ["nn.dense"], ["nn.conv2d", "nn.dense"]):
        assert count_layers(mod, ops) == tvm_count_layers(mod, ops)


@pytest.mark.parametrize("name", ["resnet-18", "squeezenet1.1", "inception_v3"])
def test_counts_every_call_where_tvm_counts_the_longest_chain(name):
    mod = model(name)
    ours, tvms = count_layers(mod, ["nn.conv2d"]), tvm_count_layers(mod, ["nn.conv2d"])
    assert ours == _text_count(mod, "nn.conv2d")
    assert ours > tvms  # parallel branches (shortcuts, fire modules, inception towers)


def test_expression_function_and_module_agree():
    mod = model("resnet-18")
    assert count_layers(mod, "nn.conv2d") == count_layers(mod["main"], "nn.conv2d") == count_layers(mod["main"].body, ["nn.conv2d"])


def test_module_counts_every_relay_function():
    main = small_conv_net()["main"]
    mod = tvm.IRModule({"main": main, "helper": main})
    assert count_layers(mod, ["nn.conv2d"]) == 4
    rows = layer_table(mod, ["nn.conv2d"])
    assert [row.index for row in rows] == [0, 1, 2, 3]


def test_layer_zero_is_closest_to_the_input():
    rows = layer_table(small_conv_net(channels=8), ["nn.conv2d", "nn.max_pool2d"])
    assert [row.op for row in rows] == ["nn.conv2d", "nn.conv2d", "nn.max_pool2d"]
    assert rows[0].input_shapes[0] == (1, 8, 16, 16)
    assert rows[2].output_shape == (1, 8, 8, 8)
    assert not rows[2].qualifies and "no HWNC tensor-core schedule" in rows[2].reason


def test_layer_table_on_resnet18():
    rows = layer_table(model("resnet-18"), ["nn.conv2d"], dtype="int4")
    assert len(rows) == 21
    first = rows[0]
    assert (first.op, first.input_shapes, first.input_dtypes) == ("nn.conv2d", ((1, 3, 224, 224), (64, 3, 7, 7)), ("float32", "float32"))
    assert (first.output_shape, first.output_dtype, first.data_layout, first.kernel_layout) == ((1, 64, 112, 112), "float32", "NCHW", "OIHW")
    assert not first.qualifies and "3 input channels" in first.reason
    assert all(row.qualifies for row in rows[1:])
    assert "3 input channels" in str(first)


def test_layer_table_flags_depthwise_layers():
    rows = layer_table(model("mobilenet"), ["nn.conv2d"], dtype="int8")
    depthwise = [row for row in rows if "groups=" in row.reason]
    assert len(depthwise) == 13
    assert any(row.qualifies for row in rows)


def test_layer_table_types_an_untyped_input_without_changing_it():
    mod = conv_chain(3)
    before = tvm.ir.save_json(mod)
    assert len(layer_table(mod, ["nn.conv2d"])) == 3
    assert tvm.ir.save_json(mod) == before


@pytest.mark.parametrize(
    "ops, error, words",
    [
        (["nn.conv2dd"], ValueError, "nn.conv2d"),
        (["nope"], ValueError, "not a registered Relay operator"),
        ([], ValueError, "empty"),
        ([3], TypeError, "op names"),
        (None, TypeError, "valid_ops"),
    ],
)
def test_bad_op_names(ops, error, words):
    with pytest.raises(error, match=words):
        count_layers(small_conv_net(), ops)
    with pytest.raises(error, match="valid_ops"):
        layer_table(small_conv_net(), ops)


def test_bad_inputs():
    with pytest.raises(TypeError, match="IRModule or a relay.Expr"):
        count_layers("resnet", ["nn.conv2d"])
    x = relay.var("x", shape=(1, 3, 8, 8))
    bad = tvm.IRModule.from_expr(relay.nn.conv2d(x, relay.var("w", shape=(4, 5, 3, 3))))
    with pytest.raises(ValueError, match="does not type-check"):
        layer_table(bad, ["nn.conv2d"])
    with pytest.raises(ValueError, match="dtype"):
        layer_table(small_conv_net(), ["nn.conv2d"], dtype="int3x")


@pytest.mark.parametrize("numbering, error", [("depth", ValueError), ("TVM", ValueError), (1, TypeError)])
def test_bad_numbering(numbering, error):
    for call in (count_layers, layer_table):
        with pytest.raises(error, match="numbering.*'chain', 'tvm'"):
            call(small_conv_net(), ["nn.conv2d"], numbering=numbering)
    no_main = tvm.IRModule({"helper": small_conv_net()["main"]})
    assert count_layers(no_main, ["nn.conv2d"]) == 2
    with pytest.raises(ValueError, match="numbering='tvm' numbers the layers of main"):
        count_layers(no_main, ["nn.conv2d"], numbering="tvm")


@pytest.mark.parametrize("name", ["resnet-18", "squeezenet1.1", "inception_v3", "mobilenet", "mlp"])
def test_tvm_numbering_equals_tvms_count_layers(name):
    mod = model(name)
    for ops in (["nn.conv2d"], ["nn.conv2d", "nn.dense"], ["nn.relu", "add"], ["concatenate"]):
        assert count_layers(mod, ops, numbering="tvm") == tvm_count_layers(mod, ops), ops


def test_tvm_numbering_counts_main_only():
    main = small_conv_net()["main"]
    mod = tvm.IRModule({"main": main, "helper": main})
    assert count_layers(mod, ["nn.conv2d"], numbering="tvm") == tvm_count_layers(mod, ["nn.conv2d"]) == 2
    rows = layer_table(mod, ["nn.conv2d"], numbering="tvm")
    assert [row.index for row in rows] == [0, 1]


def test_layer_table_tvm_numbering_shares_indices_of_parallel_layers():
    mod = model("resnet-18")
    chain, tvm_rows = layer_table(mod, ["nn.conv2d"]), layer_table(mod, ["nn.conv2d"], numbering="tvm")
    # the same rows in the same order; only the index column differs
    assert [(r.op, r.input_shapes, r.reason) for r in chain] == [(r.op, r.input_shapes, r.reason) for r in tvm_rows]
    indices = [row.index for row in tvm_rows]
    assert sorted(set(indices)) == list(range(tvm_count_layers(mod, ["nn.conv2d"])))
    assert len(indices) - len(set(indices)) == 4  # the four shortcut convs


@pytest.mark.parametrize("name", ["resnet-18", "inception_v3", "squeezenet1.1"])
def test_iterative_walk_is_tvms_post_order(name):
    from tvm_tcutils.tensorcore._graph import post_order

    mod = model(name)
    expected = []
    relay.analysis.post_order_visit(mod["main"], expected.append)
    assert [n.handle.value for n in post_order(mod["main"])] == [n.handle.value for n in expected]


def test_iterative_walk_covers_let_if_and_tuples():
    from tvm_tcutils.tensorcore._graph import post_order

    x = relay.var("x", shape=(2,))
    v = relay.var("v", shape=(2,))
    body = relay.If(relay.const(True), relay.TupleGetItem(relay.Tuple([v, x]), 0), relay.nn.relu(v))
    fn = relay.Function([x], relay.Let(v, relay.nn.relu(x), body))
    expected = []
    relay.analysis.post_order_visit(fn, expected.append)
    assert [n.handle.value for n in post_order(fn)] == [n.handle.value for n in expected]
    assert count_layers(fn, ["nn.relu"]) == 2
