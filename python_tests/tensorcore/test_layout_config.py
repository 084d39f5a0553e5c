"""LayoutConfig scopes and the ConvertLayout handlers: TVM as the oracle, skipping, bad input."""
import functools
import threading

import pytest
import tvm
from tvm import relay

import tvm_tcutils
from conftest import small_conv_net
from tvm_tcutils import LayoutConfig, count_layers, load_model
from tvm_tcutils.tensorcore._graph import layer_calls, resolve_ops


@functools.lru_cache(maxsize=None)
def model(name):
    return load_model(name)[0]


def convert(mod, data_layout, kernel_layout="default", op="nn.conv2d"):
    with tvm.transform.PassContext(opt_level=3):
        return relay.transform.ConvertLayout({op: [data_layout, kernel_layout]})(mod)


def layouts(mod, op="nn.conv2d"):
    return [(str(c.attrs.data_layout), str(c.attrs.kernel_layout)) for c in layer_calls(mod, resolve_ops(op, "ops"))]


@pytest.fixture
def tvm_handlers_only():
    """Run a block with TVM's own handlers (the package's hooks removed), then restore them."""
    tvm_tcutils.unregister()
    try:
        yield
    finally:
        tvm_tcutils.register()


@pytest.mark.parametrize("name", ["resnet-18", "mobilenet", "squeezenet1.1"])
@pytest.mark.parametrize("data_layout, kernel_layout", [("HWNC", "default"), ("NHWC", "default"), ("NHWC", "HWIO"), ("HWNC", "HWOI")])
def test_conversion_in_scope_equals_tvms_handler(name, data_layout, kernel_layout, request):
    mod = model(name)
    with LayoutConfig():
        ours = convert(mod, data_layout, kernel_layout)
    request.getfixturevalue("tvm_handlers_only")
    theirs = convert(mod, data_layout, kernel_layout)
    assert tvm.ir.structural_equal(ours, theirs)


def test_back_to_nchw_equals_tvms_handler(request):
    nhwc = convert(model("mobilenet"), "NHWC")
    with LayoutConfig():
        ours = convert(nhwc, "NCHW")
    request.getfixturevalue("tvm_handlers_only")
    assert tvm.ir.structural_equal(ours, convert(nhwc, "NCHW"))


@pytest.mark.parametrize(
    "name, skip",
    [("resnet-18", [0]), ("resnet-18", [0, 3, 8, -1]), ("squeezenet1.1", [1, 2, 5, -2]),
     ("inception_v3", [0, 7, 8, 9, 30, -1]), ("mobilenet", [0, 1, -1])],
)
def test_skipped_layers_are_exactly_the_listed_indices(name, skip):
    mod = model(name)
    total = count_layers(mod, ["nn.conv2d"])
    with LayoutConfig(skip_layers=skip, num_layers=total) as config:
        out = convert(mod, "HWNC")
    assert config.layers_seen == {"nn.conv2d": total}
    kept = {i for i, (layout, _) in enumerate(layouts(out)) if layout == "NCHW"}
    assert kept == {i % total for i in skip}
    assert all(kernel == "HWOI" for layout, kernel in layouts(out) if layout == "HWNC")
    relay.transform.InferType()(out)


def test_scope_agrees_with_tvms_layout_config(request):
    # TVM's LayoutConfig numbers layers the same way; its handler honours it.
    mod = model("inception_v3")
    skip = [0, 1, 2, 10, 11, 40]
    with LayoutConfig(skip_layers=skip):
        ours = convert(mod, "HWNC")
    request.getfixturevalue("tvm_handlers_only")
    with relay.transform.LayoutConfig(skip_layers=skip):
        theirs = convert(mod, "HWNC")
    assert tvm.ir.structural_equal(ours, theirs)


def test_without_our_scope_tvms_layout_config_still_works():
    mod = model("resnet-18")
    with relay.transform.LayoutConfig(skip_layers=[0, 2]):
        out = convert(mod, "HWNC")
    assert [i for i, (layout, _) in enumerate(layouts(out)) if layout == "NCHW"] == [0, 2]


def test_nested_scopes():
    mod = small_conv_net()
    assert LayoutConfig.current is None
    outer, inner = LayoutConfig(skip_layers=[0]), LayoutConfig(skip_layers=[1])
    with outer:
        assert LayoutConfig.current is outer
        first = convert(mod, "HWNC")
        with inner:
            assert LayoutConfig.current is inner
            second = convert(mod, "HWNC")
        assert LayoutConfig.current is outer
        # The outer scope goes on counting where it was: both of its layers are already seen.
        third = convert(mod, "HWNC")
        with outer:  # re-entering starts a fresh count
            fourth = convert(mod, "HWNC")
    assert LayoutConfig.current is None
    assert [layout for layout, _ in layouts(first)] == ["NCHW", "HWNC"]
    assert [layout for layout, _ in layouts(second)] == ["HWNC", "NCHW"]
    assert [layout for layout, _ in layouts(third)] == ["HWNC", "HWNC"]
    assert [layout for layout, _ in layouts(fourth)] == ["NCHW", "HWNC"]


def _mixed_conv_net():
    """nn.conv2d, conv2d_transpose, qnn.conv2d, nn.conv2d: only the nn.conv2d calls are layers to TVM's LayoutConfig."""
    x, w = relay.var("x", shape=(1, 8, 8, 8)), relay.var("w", shape=(8, 8, 3, 3))
    y = relay.nn.conv2d(x, w, padding=(1, 1))
    y = relay.nn.conv2d_transpose(y, w, padding=(1, 1), channels=8, kernel_size=(3, 3))
    y = relay.qnn.op.conv2d(
        relay.cast(y, "int8"), relay.cast(w, "int8"), relay.const(0), relay.const(0), relay.const(1.0),
        relay.const(1.0), kernel_size=(3, 3), channels=8, padding=(1, 1),
    )
    y = relay.nn.conv2d(relay.cast(y, "float32"), w, padding=(1, 1))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, w], y)))


def _convert_all(mod, data_layout):
    ops = ("nn.conv2d", "qnn.conv2d", "nn.conv2d_transpose")
    with tvm.transform.PassContext(opt_level=3):
        return relay.transform.ConvertLayout({op: [data_layout, "default"] for op in ops})(mod)


def _tvm_numbering_runs(make_config, mod):
    """Three conversions through one scope object: two in one entry, one after re-entering."""
    config = make_config([1, 2])
    with config:
        runs = [_convert_all(mod, "NHWC"), _convert_all(mod, "NHWC")]
    with config:
        runs.append(_convert_all(mod, "NHWC"))
    return runs


def test_tvm_numbering_equals_tvms_layout_config(request):
    mod = _mixed_conv_net()
    ours = _tvm_numbering_runs(lambda skip: LayoutConfig(skip_layers=skip, numbering="tvm"), mod)
    request.getfixturevalue("tvm_handlers_only")
    theirs = _tvm_numbering_runs(lambda skip: relay.transform.LayoutConfig(skip_layers=skip), mod)
    for mine, tvms in zip(ours, theirs):
        assert tvm.ir.structural_equal(mine, tvms)
    # nn.conv2d 0 and 1 in the first run, 2 and 3 in the second: layers 1 and 2 kept, once each.
    kept = [[layout for layout, _ in layouts(out)] for out in ours]
    assert kept == [["NHWC", "NCHW"], ["NCHW", "NHWC"], ["NHWC", "NHWC"]]


def test_scope_is_per_thread():
    seen = []
    with LayoutConfig(skip_layers=[0]):
        thread = threading.Thread(target=lambda: seen.append(LayoutConfig.current))
        thread.start()
        thread.join()
    assert seen == [None]


def test_negative_indices_need_the_layer_count():
    mod = small_conv_net()
    with LayoutConfig(skip_layers=[-1], num_layers=count_layers(mod, ["nn.conv2d"])) as config:
        out = convert(mod, "HWNC")
    assert config.skip_layers == {1}
    assert [layout for layout, _ in layouts(out)] == ["HWNC", "NCHW"]
    with pytest.raises(ValueError, match="num_layers"):
        LayoutConfig(skip_layers=[-1])


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(skip_layers=[1.0]), TypeError, "skip_layers"),
        (dict(skip_layers="0"), TypeError, "skip_layers"),
        (dict(skip_layers=[2], num_layers=2), ValueError, "out of range"),
        (dict(skip_layers=[0], num_layers=-1), TypeError, "num_layers"),
        (dict(skip_layers=[0], num_layers="2"), TypeError, "num_layers"),
        (dict(skip_layers=[0], numbering="depth"), ValueError, "numbering: 'depth' .* valid: 'chain', 'tvm'"),
        (dict(skip_layers=[0], numbering=None), TypeError, "numbering"),
    ],
)
def test_bad_scopes(kwargs, error, words):
    with pytest.raises(error, match=words):
        LayoutConfig(**kwargs)


@pytest.mark.parametrize(
    "desired, words",
    [(["HWNC"], "desired_layouts"), (["default", "OIHW"], "desired_layouts"), (["HWNC", "OIXW"], "permutation of OIHW")],
)
def test_bad_desired_layouts(desired, words):
    mod = small_conv_net()
    with LayoutConfig(), pytest.raises(ValueError, match=words):
        with tvm.transform.PassContext(opt_level=3):
            relay.transform.ConvertLayout({"nn.conv2d": desired})(mod)


def test_tiled_layouts_stay_tvms():
    mod = small_conv_net()
    with LayoutConfig(skip_layers=[1]):
        out = convert(mod, "NCHW8c", "OIHW8i8o")
    ops = [c.op.name for c in layer_calls(out, resolve_ops(["nn.conv2d", "nn.contrib_conv2d_NCHWc"], "ops"))]
    assert ops == ["nn.contrib_conv2d_NCHWc", "nn.conv2d"]


def _qnn_net(layout="NCHW"):
    data = relay.var("data", shape=(1, 32, 8, 8), dtype="int8")
    weight = relay.const(tvm.nd.array(__import__("numpy").ones((32, 32, 3, 3), "int8")))
    y = data
    for _ in range(2):
        y = relay.qnn.op.conv2d(
            y, weight, relay.const(0), relay.const(0), relay.const(1.0), relay.const(1.0),
            kernel_size=(3, 3), channels=32, padding=(1, 1), out_dtype="int32",
        )
        y = relay.cast(relay.clip(y, -128, 127), "int8")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([data], y)))


def test_qnn_conv2d_to_hwnc_honours_the_scope():
    mod = _qnn_net()
    with LayoutConfig(skip_layers=[0]):
        out = convert(mod, "HWNC", op="qnn.conv2d")
    assert layouts(relay.transform.InferType()(out), "qnn.conv2d") == [("NCHW", "OIHW"), ("HWNC", "HWOI")]


def test_qnn_conv2d_nhwc_is_left_to_tvm(request):
    mod = _qnn_net()
    ours = convert(mod, "NHWC", op="qnn.conv2d")
    request.getfixturevalue("tvm_handlers_only")
    assert tvm.ir.structural_equal(ours, convert(mod, "NHWC", op="qnn.conv2d"))
    with pytest.raises(Exception, match="not yet supported"):
        convert(mod, "HWNC", op="qnn.conv2d")  # what the package adds


def test_input_module_is_not_modified():
    mod = load_model("resnet-18")[0]
    # TVM's ConvertLayout types the input's nodes in place on its first run (checked_type_): let TVM's own
    # handlers do that first, so that what is compared is what the package's handlers do.
    tvm_tcutils.unregister()
    try:
        convert(mod, "HWNC")
    finally:
        tvm_tcutils.register()
    before = tvm.ir.save_json(mod)
    with LayoutConfig(skip_layers=[0]):
        convert(mod, "HWNC")
    assert tvm.ir.save_json(mod) == before


def test_qnn_conv2d_in_hwnc_computes_the_same():
    import numpy as np

    from conftest import build_and_run

    mod = _qnn_net()
    data = np.random.default_rng(0).integers(-5, 5, (1, 32, 8, 8)).astype("int8")
    expected = build_and_run(mod, inputs={"data": data})[0]
    with LayoutConfig(skip_layers=[1]):
        out = convert(mod, "HWNC", op="qnn.conv2d")
    np.testing.assert_array_equal(build_and_run(out, inputs={"data": data})[0], expected)
