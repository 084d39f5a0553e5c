"""Converted models compute the same on llvm; the plain HWNC reference conv2d against numpy."""
import functools

import numpy as np
import pytest
import tvm
from tvm import relay, te
from tvm.topi.testing import conv2d_nchw_python, dilate_python

from conftest import build_and_run, small_conv_net
from tvm_tcutils import LayoutConfig, count_layers
from tvm_tcutils.models import random_inputs, realistic_params
import tvm.relay.testing  # noqa: F401
from tvm_tcutils.tensorcore.topi.hwnc_reference import conv2d_hwnc, schedule_conv2d_hwnc


def _const(rng, shape):
    return relay.const(rng.standard_normal(shape).astype("float32") * 0.2)


def branchy_net():
    """conv+bias+relu, grouped and depthwise, strided and dilated convs, concatenate, add, pools and a dense head."""
    rng = np.random.default_rng(1)
    x = relay.var("data", shape=(2, 8, 12, 12))
    a = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, _const(rng, (16, 8, 3, 3)), padding=(1, 1), channels=16, kernel_size=(3, 3)), _const(rng, (16,))))
    b = relay.nn.conv2d(a, _const(rng, (16, 4, 3, 3)), padding=(1, 1), groups=4, channels=16, kernel_size=(3, 3))
    c = relay.nn.conv2d(a, _const(rng, (16, 1, 3, 3)), padding=(2, 2), dilation=(2, 2), groups=16, channels=16, kernel_size=(3, 3))
    cat = relay.concatenate([b, c], axis=1)
    d = relay.nn.conv2d(cat, _const(rng, (16, 32, 1, 1)), channels=16, kernel_size=(1, 1))
    e = relay.nn.relu(relay.add(d, a))
    f = relay.nn.conv2d(e, _const(rng, (24, 16, 3, 3)), strides=(2, 2), padding=(0, 1, 1, 0), channels=24, kernel_size=(3, 3))
    g = relay.nn.avg_pool2d(relay.nn.max_pool2d(f, pool_size=(2, 2), strides=(1, 1), padding=(1, 1)), pool_size=(2, 2))
    h = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(g))
    out = relay.nn.dense(h, _const(rng, (10, 24)))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def _convert(mod, layout, skip=()):
    with LayoutConfig(skip_layers=list(skip)), tvm.transform.PassContext(opt_level=3):
        return relay.transform.ConvertLayout({"nn.conv2d": [layout, "default"]})(mod)


NETS = {"branchy": branchy_net, "small_conv_net": lambda: small_conv_net(channels=8)}


@functools.lru_cache(maxsize=None)
def reference(name):
    """(module, inputs, outputs) of a net as TVM builds it in NCHW."""
    mod = NETS[name]()
    inputs = random_inputs(mod)
    return mod, inputs, build_and_run(mod, inputs=inputs)[0]


@pytest.mark.parametrize(
    "name, layout, skip",
    [("branchy", "HWNC", ()), pytest.param("branchy", "HWNC", (0, 3), marks=pytest.mark.slow),  # -m slow: skipped layers in the two below
     ("branchy", "NHWC", (1,)), ("small_conv_net", "HWNC", (1,))],
)
def test_small_nets_compute_the_same(name, layout, skip):
    mod, inputs, expected = reference(name)
    converted = _convert(mod, layout, skip)
    assert layout in converted.astext(show_meta_data=False)
    np.testing.assert_allclose(build_and_run(converted, inputs=inputs)[0], expected, rtol=1e-4, atol=1e-4)


def test_back_to_nchw_computes_the_same():
    mod, inputs, expected = reference("branchy")
    round_trip = _convert(_convert(mod, "HWNC"), "NCHW", skip=(2,))
    np.testing.assert_allclose(build_and_run(round_trip, inputs=inputs)[0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # a minute of CPU; the branchy/small nets above cover the same conversions in CI
def test_resnet18_in_hwnc_computes_the_same():
    # 32x32 images: the same 21 layers as at 224x224 (the last stage at 1x1), far less to run.
    mod, params = relay.testing.resnet.get_workload(num_layers=18, image_shape=(3, 32, 32))
    params = realistic_params(params)
    inputs = random_inputs(mod, params)
    expected = build_and_run(mod, params, inputs)[0]
    converted = _convert(mod, "HWNC", skip=(0,))
    got = build_and_run(converted, params, inputs)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert count_layers(converted, ["nn.conv2d"]) == 21


def test_strategy_row_applies_only_to_hwnc():
    x = relay.var("x", shape=(1, 8, 8, 8))
    w = relay.var("w", shape=(8, 8, 3, 3))
    target = tvm.target.Target("llvm")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.conv2d(x, w, padding=(1, 1)))))
    hwnc = relay.transform.InferType()(_convert(mod, "HWNC"))

    def chosen(m):
        calls = []
        relay.analysis.post_order_visit(m["main"], lambda n: isinstance(n, relay.Call) and n.op.name == "nn.conv2d" and calls.append(n))
        call = calls[0]
        inputs = [te.placeholder([int(d) for d in a.checked_type.shape], a.checked_type.dtype) for a in call.args]
        with target:
            impl, _ = relay.backend.te_compiler.select_implementation(call.op, call.attrs, inputs, call.checked_type, target)
        return impl.name

    assert chosen(hwnc) == "conv2d_hwnc_reference.cpu"
    assert chosen(mod) != "conv2d_hwnc_reference.cpu"


def _reference(data_hwnc, kernel, kernel_layout, strides, padding, dilation, groups):
    """numpy: HWNC -> NCHW, kernel -> OIHW, grouped conv, back to HWNC."""
    data = data_hwnc.transpose(2, 3, 0, 1)
    oihw = kernel.transpose([kernel_layout.index(axis) for axis in "OIHW"])
    oihw = dilate_python(oihw, (1, 1, dilation, dilation)) if dilation > 1 else oihw
    per_group_out = oihw.shape[0] // groups
    per_group_in = data.shape[1] // groups
    outs = [
        conv2d_nchw_python(
            data[:, g * per_group_in:(g + 1) * per_group_in].astype("int64" if data.dtype.kind == "i" else data.dtype),
            oihw[g * per_group_out:(g + 1) * per_group_out].astype("int64" if data.dtype.kind == "i" else data.dtype),
            strides, padding,
        )
        for g in range(groups)
    ]
    return np.concatenate(outs, axis=1).transpose(2, 3, 0, 1)


@pytest.mark.parametrize(
    "kernel_layout, strides, padding, dilation, groups, dtype",
    [
        ("HWOI", 1, 1, 1, 1, "float32"),
        ("HWOI", 2, (1, 0, 2, 1), 1, 1, "float32"),
        ("HWIO", 1, 2, 2, 1, "float32"),
        ("OIHW", (2, 1), 0, 1, 2, "float32"),
        ("HWOI", 1, 1, 1, 8, "float32"),
        ("HWOI", 1, 1, 1, 1, "int8"),
    ],
)
def test_reference_conv2d_against_numpy(kernel_layout, strides, padding, dilation, groups, dtype):
    rng = np.random.default_rng(0)
    height, batch, in_ch, out_ch = 9, 2, 8, 16
    data_np = rng.integers(-8, 8, (height, height, batch, in_ch)).astype(dtype)
    kshape = dict(O=out_ch, I=in_ch // groups, H=3, W=3)
    kernel_np = rng.integers(-8, 8, [kshape[a] for a in kernel_layout]).astype(dtype)
    out_dtype = "int32" if dtype == "int8" else dtype
    data = te.placeholder(data_np.shape, dtype, name="data")
    kernel = te.placeholder(kernel_np.shape, dtype, name="kernel")
    out = conv2d_hwnc(data, kernel, strides, padding, dilation, groups, kernel_layout, out_dtype)
    func = tvm.build(schedule_conv2d_hwnc(out), [data, kernel, out], "llvm")
    result = tvm.nd.empty([int(d) for d in out.shape], out_dtype)
    func(tvm.nd.array(data_np), tvm.nd.array(kernel_np), result)
    expected = _reference(data_np, kernel_np, kernel_layout, strides, padding, dilation, groups)
    np.testing.assert_allclose(result.numpy(), expected.astype(out_dtype), rtol=1e-5)


def test_reference_conv2d_rejects_mismatched_groups():
    data = te.placeholder((8, 8, 1, 6), name="data")
    kernel = te.placeholder((3, 3, 4, 4), name="kernel")
    with pytest.raises(ValueError, match="groups=2"):
        conv2d_hwnc(data, kernel, 1, 1, 1, groups=2)
