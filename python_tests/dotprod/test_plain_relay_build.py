"""``import tvm_tcutils`` + plain ``relay.build`` of a quantizer's file builds the package's integer graph (issue 31).

The ``FTVMQnnLegalize`` handler of ``qnn.quantize`` (``dotprod.qdq.legalize_quantize``) runs
``to_integer``'s rewrite region by region inside TVM's first pass, so a user's own ``relay.build`` gives
the graph of ``to_integer`` + ``relay.build`` (and of ``measure.build``): the convs on the dot-product
schedules, outputs equal to onnxruntime's.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm_tcutils  # noqa: E402
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402

from tvm_tcutils import measure  # noqa: E402
from tvm_tcutils.dotprod import qdq  # noqa: E402
from tvm_tcutils.dotprod.qdq import calls, to_integer  # noqa: E402
from tvm_tcutils.dotprod.quantize import ort_quantize  # noqa: E402

from test_qdq import CONVS, SHAPE, _host_isa, _ort, _output_scales, small_cnn  # noqa: E402

#: (file, how its weights come): frozen constants, or parameters bound by relay.build (the frontend's
#: default: zero points then arrive as ``cast(constant)``, folded by the hook as to_integer's FoldConstant).
#: ``params`` by default: the hook on bound parameters (zero points folded by the hook), and measure.build's
#: graph equal to the plain one; ``frozen`` (the frontend's constants) under -m slow: the same hook and the
#: same assertions on a module whose constants need no folding (test_qdq.py's tuning-task test runs plain
#: relay.build's pipeline on the frozen file by default).
# Every case under -m slow (the CI budget: 15 s on a slow VM): by default test_qdq.py's
# test_plain_build_of_a_residual_block_equals_to_integer checks the same equality (plain relay.build of a
# QDQ model = to_integer + relay.build) on a residual block, and test_qdq_convs_run_on_dot_product_schedules_
# and_match builds the QDQ file with plain relay.build against onnxruntime.
CASES = [pytest.param("qdq_channel", "params", marks=pytest.mark.slow),
         pytest.param("qdq_channel", "frozen", marks=pytest.mark.slow),
         pytest.param("qdq_tensor", "frozen", marks=pytest.mark.slow),  # per tensor: also in test_qdq.py
         pytest.param("qop_channel", "frozen", marks=pytest.mark.slow)]  # QOperator: also in test_qdq.py


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> quantized ONNX path (test_qdq.py's recipe), and the input to run."""
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(0, 1, SHAPE).astype("float32")} for _ in range(4)]
    folder, model = tmp_path_factory.mktemp("plain_build"), small_cnn()
    paths = {name: ort_quantize(model, str(folder / f"{name}.onnx"), samples, fmt, per_channel)
             for name, fmt, per_channel in (("qdq_channel", "qdq", True), ("qdq_tensor", "qdq", False),
                                             ("qop_channel", "qoperator", True))}
    return paths, {"x": rng.normal(0, 1, SHAPE).astype("float32")}


def _import(path, how="frozen"):
    mod, params = relay.frontend.from_onnx(onnx.load(path), {"x": SHAPE}, freeze_params=how == "frozen")
    return mod, params


def _build(mod, params=None, target=None):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target or tvm_tcutils.host_target(), params=params)


def _run(lib, inputs):
    runner = measure.graph_module(lib, inputs)
    runner.run()
    return measure.outputs(runner)


def _kernels(lib):
    return re.findall(r'"func_name": "([^"]+)"', lib.get_graph_json())


def _conv_input_dtypes(mod, params):
    """The data dtype of each packed conv TVM's pipeline makes of ``mod`` for this CPU."""
    with tvm.transform.PassContext(opt_level=3):
        optimized, _ = relay.optimize(mod, target=tvm_tcutils.host_target(), params=params)
    return [str(c.args[0].checked_type.dtype) for c in calls(optimized) if c.op.name == "nn.contrib_conv2d_NCHWc"]


@pytest.fixture
def regions(monkeypatch):
    """Whether each call of the hook made a region integer (``qdq.integer_region`` watched)."""
    original, made = qdq.integer_region, []

    def spy(quantize, requantize="onnx"):
        found = original(quantize, requantize)
        made.append(found is not None)
        return found

    monkeypatch.setattr(qdq, "integer_region", spy)
    return made


@pytest.mark.parametrize("name,how", CASES)
def test_plain_relay_build_is_to_integer_then_relay_build(files, regions, name, how):
    isa = _host_isa()
    paths, inputs = files
    mod, params = _import(paths[name], how)
    text = mod.astext()
    plain = _build(mod, params)                       # what a TVM user writes, after import tvm_tcutils
    # The hook made each region integer, once: every qnn.quantize of these files ends one.
    assert regions.count(True) == sum(c.op.name == "qnn.quantize" for c in calls(mod)), regions
    regions.clear()
    bound = mod
    if params:
        bound = tvm.IRModule.from_expr(relay.build_module.bind_params_by_name(mod["main"], params))
    reference = _build(to_integer(bound))             # the package's rewrite, then TVM's build
    assert not any(regions), regions                  # a module already integer: the hook adds nothing
    assert plain.get_graph_json() == reference.get_graph_json()
    if how == "params":                               # the package's own build binds them the same way
        assert measure.build(mod, params=params).get_graph_json() == plain.get_graph_json()
    ours = _run(plain, inputs)
    for got, want in zip(ours, _run(reference, inputs)):
        np.testing.assert_array_equal(got, want)
    # The dot-product schedules: both convs packed (contrib_conv2d_NCHWc), on vpdpbusd with VNNI.
    assert sum("contrib_conv2d_NCHWc" in k for k in _kernels(plain)) == CONVS
    if isa.name == "x86_vnni" and name == "qdq_channel":
        assert "vpdpbusd" in plain.get_lib().get_source("asm")
    want = _ort(paths[name], inputs)
    if name.startswith("qdq"):
        for got, expected in zip(ours, want):   # as test_qdq.py: equal to onnxruntime
            np.testing.assert_array_equal(got, expected)
        # The input module is not changed. (On the QOperator file TVM's own qnn.requantize
        # canonicalization fills in the attributes of the caller's nodes, with or without the package.)
        assert mod.astext() == text
    else:  # QLinearConv through qnn.requantize (half up): one output step at most, as test_qdq.py
        for got, expected, step in zip(ours, want, _output_scales(paths[name])):
            assert np.abs(got - expected).max() <= step * 1.001


# -m slow (CI time): test_registry.py restores TVM's hooks on unregister and reinstalls them, and
# test_invariants.py builds float models the same with and without the package, by default.
@pytest.mark.slow
def test_unregister_brings_back_the_float_path_and_float_models_build_the_same(files):
    _host_isa()
    mod, params = _import(files[0]["qdq_channel"])
    float_mod, float_params = relay.frontend.from_onnx(small_cnn(), {"x": SHAPE})
    x = {"x": np.random.default_rng(2).normal(0, 1, SHAPE).astype("float32")}
    assert _conv_input_dtypes(mod, params) == ["uint8"] * CONVS
    with_hook = _build(float_mod, float_params)
    tvm_tcutils.unregister()
    try:
        assert tvm.ir.Op.get("qnn.quantize").get_attr("FTVMQnnLegalize") is None
        assert _conv_input_dtypes(mod, params) == ["float32"] * CONVS   # TVM's float path
        without = _build(float_mod, float_params)
    finally:
        tvm_tcutils.register()
    assert _conv_input_dtypes(mod, params) == ["uint8"] * CONVS
    # A float model: the same graph and outputs with and without the hook (and every other hook).
    assert with_hook.get_graph_json() == without.get_graph_json()
    for got, want in zip(_run(with_hook, x), _run(without, x)):
        np.testing.assert_array_equal(got, want)


# Under -m slow: test_invariants.py's qdq/llvm case (the same QDQ conv built for plain llvm gives the same
# graph and outputs with and without the package) and test_handler_leaves_what_is_not_a_region_to_tvm
# (the hook hands plain llvm back to TVM) check this by default.
@pytest.mark.slow
def test_targets_without_a_dot_product_isa_keep_tvms_lowering(files):
    # The hook decides as the package's build does (qdq.rewrites_for): plain llvm keeps the float convs.
    mod, params = _import(files[0]["qdq_channel"])
    assert not qdq.rewrites_for("llvm")
    with tvm.transform.PassContext(opt_level=3):
        optimized, _ = relay.optimize(mod, target="llvm", params=params)
    dtypes = {str(c.args[0].checked_type.dtype) for c in calls(optimized) if c.op.name.startswith("nn.conv2d")
              or c.op.name == "nn.contrib_conv2d_NCHWc"}
    assert dtypes == {"float32"}, dtypes


def test_handler_leaves_what_is_not_a_region_to_tvm():
    x = relay.var("x", shape=(2, 8))
    quantize = relay.qnn.op.quantize(x, relay.const(0.1), relay.const(0), out_dtype="int8")
    call = relay.transform.InferType()(tvm.IRModule.from_expr(quantize))["main"].body
    types = [a.checked_type for a in call.args] + [call.checked_type]
    with tvm.target.Target("llvm"):                    # no dot-product ISA: TVM's lowering
        assert qdq.legalize_quantize(call.attrs, call.args, types) is None
    with tvm.target.Target("llvm -mcpu=znver4"):       # a float input: ONNX rounding, as to_integer
        legal = qdq.legalize_quantize(call.attrs, call.args, types)
    assert isinstance(legal, relay.Call) and "qnn.quantize" not in {c.op.name for c in calls(legal)}
    per_channel = relay.qnn.op.quantize(x, relay.const(np.full(8, 0.1, "float32")), relay.const(0), axis=1)
    call = relay.transform.InferType()(tvm.IRModule.from_expr(per_channel))["main"].body
    with tvm.target.Target("llvm -mcpu=znver4"):       # per-channel output: to_integer keeps it too
        assert qdq.legalize_quantize(call.attrs, call.args, [a.checked_type for a in call.args]) is None


def _gelu_module():
    """u8 -> dequantize -> GELU (erf) -> quantize u8: a quantized encoder's feed-forward activation."""
    x = relay.var("x", shape=(4, 256), dtype="uint8")
    scale, zero = relay.const(0.05), relay.const(128)
    dq = relay.qnn.op.dequantize(x, scale, zero)
    gelu = dq * relay.const(0.5) * (relay.const(1.0) + relay.erf(dq * relay.const(0.7071067811865476)))
    out = relay.qnn.op.quantize(gelu, relay.const(0.03), relay.const(10), out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], out))


def _softmax_module():
    """u8 scores -> dequantize -> softmax -> quantize u8 (scale 1/255): attention's probabilities."""
    x = relay.var("x", shape=(4, 256), dtype="uint8")
    dq = relay.qnn.op.dequantize(x, relay.const(0.05), relay.const(128))
    out = relay.qnn.op.quantize(relay.nn.softmax(dq), relay.const(1 / 255), relay.const(0), out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], out))


@pytest.mark.parametrize("make, libm", [(_gelu_module, "erff"), (_softmax_module, "expf")], ids=["gelu", "softmax"])
def test_quantized_region_uses_the_fast_forms(make, libm):
    import tvm.contrib.graph_executor  # noqa: F401

    target = tvm_tcutils.host_target()
    if not qdq.rewrites_for(target):
        pytest.skip(f"{target} has no dot-product ISA: the package leaves the build to TVM")
    mod = make()
    values = np.random.default_rng(0).integers(0, 256, size=(4, 256)).astype("uint8")

    def build_and_run():
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=target)
        runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
        runner.set_input("x", values)
        runner.run()
        return lib.lib.get_source("asm"), runner.get_output(0).numpy().astype(int)

    asm, fast = build_and_run()
    tvm_tcutils.unregister()
    try:
        tvm_asm, exact = build_and_run()
    finally:
        tvm_tcutils.register()
    # TVM lowers erf and exp to a libm call per element; the fast forms are inline, vectorized arithmetic.
    assert libm in tvm_asm and libm not in asm
    assert np.abs(fast - exact).max() <= 1  # at most one 8-bit step, where the two forms round apart


def _requantize_call(dtype, in_scale=0.02):
    x = relay.var("x", shape=(2, 8), dtype=dtype)
    scale = relay.const(np.float32(in_scale)) if np.isscalar(in_scale) else relay.const(in_scale)
    q = relay.qnn.op.requantize(x, scale, relay.const(0), relay.const(0.5), relay.const(3), axis=1,
                                out_dtype="uint8")
    call = relay.transform.InferType()(tvm.IRModule.from_expr(q))["main"].body
    return call, [a.checked_type for a in call.args] + [call.checked_type]


@pytest.mark.parametrize("target, dtype, taken", [
    ("llvm -mcpu=znver4", "int32", True),      # an accumulator on a dot-product target: onnxruntime's arithmetic
    ("llvm", "int32", False),                  # no dot-product ISA: TVM's lowering
    ("llvm -mcpu=znver4", "uint8", False),     # an 8-bit rescale: TVM's
])
def test_requantize_handler_takes_accumulators_on_dot_product_targets(target, dtype, taken):
    call, types = _requantize_call(dtype)
    with tvm.target.Target(target):
        legal = qdq.legalize_requantize(call.attrs, call.args, types)
    assert (legal is not None) == taken


def test_requantize_handler_matches_onnx_arithmetic_per_channel():
    import tvm.contrib.graph_executor  # noqa: F401

    target = tvm_tcutils.host_target()
    if not qdq.rewrites_for(target):
        pytest.skip(f"{target} has no dot-product ISA: TVM's requantize")
    rng = np.random.default_rng(4)
    scales = rng.uniform(0.001, 0.05, 8).astype("float32")
    scales[0] = 0.25  # multiplier 0.5: odd accumulators are exact halves, which round to even
    call, _ = _requantize_call("int32", scales)
    acc = rng.integers(-3000, 3000, (2, 8)).astype("int32")
    acc[:, 0] = [5, -7]
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([call.args[0]], call)), target=target)
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input("x", acc)
    runner.run()
    multiplier = (scales / np.float32(0.5)).astype("float32")
    want = np.clip(np.round(acc.astype("float32") * multiplier) + 3, 0, 255).astype("uint8")  # numpy: half to even
    np.testing.assert_array_equal(runner.get_output(0).numpy(), want)
