"""int8 models from onnxruntime's quantizer (QDQ and QOperator) on the dot-product schedules."""
from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tvm_tcutils  # noqa: E402
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402

from tvm_tcutils import measure  # noqa: E402
from tvm_tcutils.dotprod.isa import for_target  # noqa: E402
from tvm_tcutils.dotprod.qdq import calls, qdq_regions, quantized_to_integer, to_integer  # noqa: E402
from tvm_tcutils.dotprod.quantize import ort_quantize  # noqa: E402
from tvm_tcutils.onnx_writer import OnnxGraph  # noqa: E402

SHAPE = (1, 3, 16, 16)
CONVS = 2


def small_cnn():
    """A 3x3 conv, a 3x3 conv with a residual add, a concat, max pool, global pool, MatMul + Add.

    Two outputs: the logits and the pooled feature map (2,048 values to compare).
    """
    rng = np.random.default_rng(0)
    g = OnnxGraph("small_cnn")
    g.input("x", "float32", SHAPE)

    def conv(x, cin, cout):
        w = g.const(rng.normal(0, (2.0 / (cin * 9)) ** 0.5, (cout, cin, 3, 3)).astype("float32"), "w")
        b = g.const(rng.normal(0, 0.1, cout).astype("float32"), "b")
        return g.node("Conv", [x, w, b], kernel_shape=[3, 3], pads=[1] * 4)

    y = g.node("Relu", [conv("x", 3, 16)])
    residual = g.node("Relu", [g.node("Add", [y, conv(y, 16, 16)])])
    pooled = g.node("MaxPool", [g.node("Concat", [residual, y], axis=1)], kernel_shape=[2, 2], strides=[2, 2])
    y = g.node("Flatten", [g.node("GlobalAveragePool", [pooled])])
    y = g.node("MatMul", [y, g.const(rng.normal(0, 0.2, (32, 10)).astype("float32"), "fc")])
    y = g.node("Add", [y, g.const(rng.normal(0, 0.1, 10).astype("float32"), "fb")])
    g.output(y, "float32", [1, 10])
    g.output(pooled, "float32", [1, 32, 8, 8])
    return g.model()


def attention_scores():
    """Two MatMuls by constant weights and one of two activations (3-D: ``batch_matmul``)."""
    rng = np.random.default_rng(2)
    g = OnnxGraph("scores")
    g.input("x", "float32", [2, 8, 16])
    q, k = (g.node("MatMul", ["x", g.const(rng.normal(0, 0.3, (16, 16)).astype("float32"), "w")]) for _ in "qk")
    g.output(g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 2, 1])]), "float32", [2, 8, 8])
    return g.model()


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """name -> (quantized ONNX path, input) for QDQ per-channel / per-tensor and QOperator per-channel."""
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(0, 1, SHAPE).astype("float32")} for _ in range(4)]
    folder, model = tmp_path_factory.mktemp("qdq"), small_cnn()
    files = {
        name: ort_quantize(model, str(folder / f"{name}.onnx"), samples, fmt, per_channel)
        for name, fmt, per_channel in (("qdq_channel", "qdq", True), ("qdq_tensor", "qdq", False),
                                        ("qop_channel", "qoperator", True))
    }
    return files, {"x": rng.normal(0, 1, SHAPE).astype("float32")}


def _import(path):
    return relay.frontend.from_onnx(onnx.load(path), {"x": SHAPE}, freeze_params=True)[0]


@pytest.fixture(scope="module")
def outputs(quantized):
    """``outputs(name, how)``: outputs and kernel names of one build, each build done once.

    ``how``: ``"package"`` (``measure.build`` for this CPU, as a user builds), ``"reference"``
    (TVM's own lowering of the integer module: plain ``llvm``, where the package hands every op
    over to TVM).
    """
    files, inputs = quantized
    done = {}

    def run(name, how):
        if (name, how) not in done:
            mod = _import(files[name])
            lib = {"package": lambda: measure.build(mod),
                   "reference": lambda: measure.build(to_integer(mod), target="llvm")}[how]()
            runner = measure.graph_module(lib, inputs)
            runner.run()
            done[name, how] = (measure.outputs(runner), re.findall(r'"func_name": "([^"]+)"', lib.get_graph_json()),
                               lib.get_lib().get_source("asm") if how == "package" else "")
        return done[name, how]

    return run


def _ort(path, inputs):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, inputs)


def _output_scales(path):
    """The scale of each graph output's final ``DequantizeLinear``: one quantization step of it."""
    model = onnx.load(path)
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {n.output[0]: n for n in model.graph.node}
    return [float(values[producer[out.name].input[1]]) for out in model.graph.output]


def _host_isa():
    isa = for_target(tvm_tcutils.host_target())
    if isa is None or not isa.name.startswith("x86"):
        pytest.skip(f"no x86 dot-product ISA on this CPU ({tvm_tcutils.host_target()})")
    return isa


def test_frontend_keeps_qdq_regions_float_and_the_pass_makes_them_integer(quantized):
    mod = _import(quantized[0]["qdq_channel"])
    assert sorted(set(qdq_regions(mod))) == ["add", "nn.bias_add", "nn.conv2d", "nn.dense", "nn.global_avg_pool2d"]
    integer = to_integer(mod)
    assert qdq_regions(integer) == []
    assert sum(c.op.name == "qnn.conv2d" for c in calls(integer)) == CONVS
    assert sum(c.op.name == "qnn.dense" for c in calls(integer)) == 1
    assert not any(c.op.name in ("nn.conv2d", "nn.dense") for c in calls(integer))
    assert tvm.ir.structural_equal(mod, _import(quantized[0]["qdq_channel"]))  # the input is unchanged
    # The same as a pass in a Sequential pipeline.
    seq = tvm.transform.Sequential([relay.transform.InferType(), quantized_to_integer()])
    assert tvm.ir.structural_equal(seq(mod), integer)


@pytest.mark.parametrize("name", ["qdq_channel", "qdq_tensor"])
def test_qdq_convs_run_on_dot_product_schedules_and_match(quantized, outputs, name):
    isa = _host_isa()
    files, inputs = quantized
    ours, kernels, asm = outputs(name, "package")   # the package's build: QDQ regions made integer
    assert sum("contrib_conv2d_NCHWc" in k for k in kernels) == CONVS
    if isa.name == "x86_vnni":
        assert "vpdpbusd" in asm
    if name == "qdq_channel":
        for got, want in zip(ours, outputs(name, "reference")[0]):
            np.testing.assert_array_equal(got, want)
    # onnxruntime runs the QDQ file as QLinearConv / QLinearMatMul / QLinearAdd...: same results.
    for got, want in zip(ours, _ort(files[name], inputs)):
        np.testing.assert_array_equal(got, want)


def test_qoperator_file_on_dot_product_schedules(quantized, outputs):
    _host_isa()
    files, inputs = quantized
    ours, kernels, _ = outputs("qop_channel", "package")
    assert sum("contrib_conv2d_NCHWc" in k for k in kernels) == CONVS
    # The per-channel kernel zero points (all 0) become a scalar (qdq.legalize_uniform_zero_point): no
    # kernels sum the data over channels for a zero term (two more here without it): no more kernels
    # than the QDQ file's build.
    assert len(kernels) <= len(outputs("qdq_channel", "package")[1]), kernels
    # The frontend lowers QLinearConv with qnn.requantize; on dot-product targets the package's
    # FTVMQnnLegalize handler (qdq.legalize_requantize) computes it as onnxruntime does: equal.
    for got, want in zip(ours, _ort(files["qop_channel"], inputs)):
        np.testing.assert_array_equal(got, want)


def test_matmul_of_activations(tmp_path):
    rng = np.random.default_rng(3)
    samples = [{"x": rng.normal(0, 1, (2, 8, 16)).astype("float32")} for _ in range(3)]
    path = ort_quantize(attention_scores(), str(tmp_path / "scores.onnx"), samples)
    mod = relay.frontend.from_onnx(onnx.load(path), freeze_params=True)[0]
    assert qdq_regions(mod) == ["nn.dense", "nn.dense", "nn.batch_matmul"]
    integer = to_integer(mod)
    assert qdq_regions(integer) == []
    assert sorted(c.op.name for c in calls(integer) if c.op.name in ("qnn.dense", "qnn.batch_matmul")) == [
        "qnn.batch_matmul", "qnn.dense", "qnn.dense"]
    want, (step,) = _ort(path, samples[0])[0], _output_scales(path)
    for how, integer_mod, steps in (("onnx", mod, 0), ("qnn", to_integer(mod, requantize="qnn"), 1)):
        runner = measure.graph_module(measure.build(integer_mod), samples[0])
        runner.run()
        # ONNX requantization: equal; TVM's qnn.requantize (float32, rounding half up): one step at most.
        assert np.abs(measure.outputs(runner)[0] - want).max() <= steps * step * 1.001, how


def test_qnn_requantize_option_makes_the_same_regions_integer(quantized):
    with_qnn = to_integer(_import(quantized[0]["qdq_channel"]), requantize="qnn")
    assert qdq_regions(with_qnn) == []
    names = [c.op.name for c in calls(with_qnn)]
    assert names.count("qnn.conv2d") == CONVS and "qnn.requantize" in names and "qnn.add" in names


def test_bad_arguments():
    with pytest.raises(ValueError, match="requantize must be one of"):
        quantized_to_integer("fast")
    with pytest.raises(TypeError, match="mod must be a tvm.IRModule"):
        to_integer(relay.var("x"))
    with pytest.raises(ValueError, match="fmt must be one of"):
        ort_quantize(small_cnn(), "/nonexistent/x.onnx", [{}], fmt="qint")


def autotvm_task_names(mod):
    from tvm import autotvm

    return [t.name for t in autotvm.task.extract_from_program(mod["main"], target=tvm_tcutils.host_target(),
                                                              params={})]


def test_tuning_tasks_of_a_qdq_file_are_its_integer_convs(quantized):
    # What `tvm-tcutils tune` extracts is what measure.build builds: the integer convs on the
    # dot-product templates, not the float convs the QDQ file holds.
    _host_isa()
    from tvm_tcutils import tuning

    mod = _import(quantized[0]["qdq_channel"])
    names = [task.name for task in tuning.extract_tasks(mod, {}, tvm_tcutils.host_target())]
    assert names.count("tcutils.conv2d_nchw_dot") == CONVS, names
    # TVM's own extraction runs plain relay.build's pipeline, where the package's FTVMQnnLegalize hook
    # makes the same regions integer (test_plain_relay_build.py): the same tasks.
    plain = autotvm_task_names(mod)
    assert sorted(plain) == sorted(names), plain


@pytest.mark.parametrize("name", ["qdq_channel", "qop_channel"])
def test_int8_commands_build_a_quantizers_model_as_it_is(quantized, name):
    # `tvm-tcutils bench/tune FILE` (int8 by default) on a quantizer's file: no second quantization.
    from tvm_tcutils.dotprod.quantize import is_quantized, prepare

    mod = _import(quantized[0][name])
    assert is_quantized(mod)
    out, params = prepare(mod, {}, "int8")
    assert out is mod and params == {}


def test_bench_command_on_a_qdq_file(quantized):
    from conftest import run_cli

    proc = run_cli("bench", quantized[0]["qdq_channel"], "--repeat", "1", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is already quantized: built as it is, without a float32 baseline" in proc.stdout
    assert "int8 on " in proc.stdout and "speedup" not in proc.stdout
