"""int8 models from onnxruntime's quantizer (QDQ and QOperator) on the dot-product schedules."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tvm_tcutils  # noqa: E402
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402

from conftest import runtime_exact_weight_bound  # noqa: E402
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
        for name, fmt, per_channel in (("qdq_channel", "qdq", True), ("qdq_tensor", "qdq", False))
    }
    # The QOperator file is compared with onnxruntime's QLinearConv, which saturates full-range weights
    # where the CPU has no VNNI: there it is quantized as onnxruntime advises, reduce_range (the package
    # then builds its 7-bit AVX2 step for it).
    files["qop_channel"] = ort_quantize(model, str(folder / "qop_channel.onnx"), samples, "qoperator", True,
                                        reduce_range=runtime_exact_weight_bound() < 127)
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


def _residual_block(downsample: bool, shared: bool = False):
    """QDQ relay of a bottleneck's end: 1x1 conv (64 -> 128), quantized, added to a residual, quantized.

    ``downsample``: the residual is a second conv of the block's input (both branches are convs);
    else the 8-bit input itself. ``shared``: the conv's quantized output also feeds another conv, which
    the add reads (so the conv's 8 bits have a second reader).
    """
    rng = np.random.default_rng(4)
    cin, cout, hw = 64, 128, 8
    x = relay.var("x", shape=(1, cin, hw, hw), dtype="uint8")
    dq = lambda q, s, z: relay.qnn.op.dequantize(q, relay.const(np.float32(s)), relay.const(z))  # noqa: E731
    qz = lambda v, s, z: relay.qnn.op.quantize(v, relay.const(np.float32(s)), relay.const(z),  # noqa: E731
                                               out_dtype="uint8")

    def conv(data, channels_in):
        w = rng.integers(-127, 128, (cout, channels_in, 1, 1)).astype("int8")
        scales = rng.uniform(0.002, 0.01, cout).astype("float32")
        weight = relay.qnn.op.dequantize(relay.const(w), relay.const(scales), relay.const(np.zeros(cout, "int32")),
                                         axis=0)
        return relay.nn.conv2d(data, weight, channels=cout, kernel_size=(1, 1))

    main = qz(conv(dq(x, 0.04, 3), cin), 0.0228, 130)
    if shared:
        other = qz(relay.nn.relu(conv(dq(main, 0.0228, 130), cout)), 0.05, 0)
    elif downsample:
        other = qz(conv(dq(x, 0.04, 3), cin), 0.1188, 129)
    else:
        other = relay.var("r", shape=(1, cout, hw, hw), dtype="uint8")
    other_dq = dq(other, 0.05, 0) if shared else dq(other, 0.1188, 129)
    out = qz(relay.add(dq(main, 0.0228, 130), other_dq), 0.0612, 0)
    inputs = {"x": rng.integers(0, 256, (1, cin, hw, hw)).astype("uint8")}
    if not (downsample or shared):
        inputs["r"] = rng.integers(0, 256, (1, cout, hw, hw)).astype("uint8")
    return tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(out), out)), inputs


def _add_operands_8bit(integer: tvm.IRModule):
    """For the integer module's last float add: per operand, whether its chain down to the product or
    input reads 8 bits (a cast to 8 bits, an 8-bit input), and whether it passes a ``stop_fusion``."""
    adds = [c for c in calls(integer) if c.op.name == "add" and str(c.checked_type.dtype) == "float32"
            and all(isinstance(a, relay.Call) and a.op.name == "multiply" for a in c.args)]
    found = []
    for operand in adds[-1].args:
        expr, eight, stop = operand, False, False
        while isinstance(expr, relay.Call) and expr.op.name not in ("qnn.conv2d", "nn.conv2d"):
            eight |= expr.op.name == "cast" and str(expr.attrs.dtype) == "uint8"
            stop |= expr.op.name == "annotation.stop_fusion"
            expr = expr.args[0]
        eight |= isinstance(expr, relay.Var) and str(expr.type_annotation.dtype) == "uint8"
        found.append((eight, stop))
    return found


def _run_integer(integer, inputs):
    runner = measure.graph_module(measure.build(integer), inputs)
    runner.run()
    return measure.outputs(runner)[0]


@pytest.mark.parametrize("downsample", [False, True])
def test_residual_add_reads_the_conv_result_before_its_8_bit_cast(downsample, monkeypatch):
    mod, inputs = _residual_block(downsample)
    integer = relay.transform.InferType()(to_integer(mod))
    # The conv's operand is read at the rounding (no 8-bit round trip); a second conv branch (downsampling)
    # ends its kernel in 8 bits (stop_fusion).
    want = sorted([(False, False), (True, True)] if downsample else [(False, False), (True, False)])
    assert sorted(_add_operands_8bit(integer)) == want
    # The value the round trip through 8 bits gives: only where the kernel fuses a different product of the
    # add into an FMA (TVM makes a * b + c * d one) can a near tie round the other way.
    import tvm_tcutils.dotprod.qdq as qdq

    monkeypatch.setattr(qdq, "saturated_parts", lambda expr: None)
    round_trip = relay.transform.InferType()(to_integer(mod))
    assert sorted(_add_operands_8bit(round_trip)) == [(True, False), (True, False)]
    got, want = (_run_integer(m, inputs).astype("int32") for m in (integer, round_trip))
    assert np.abs(got - want).max() <= 1 and np.mean(got != want) < 0.01


def test_residual_add_keeps_the_8_bits_of_a_conv_result_read_twice():
    # The add's other operand reads the conv's 8-bit result too: read in float by the add, the conv's
    # kernel would end in float32 for both readers.
    mod, _ = _residual_block(downsample=False, shared=True)
    integer = relay.transform.InferType()(to_integer(mod))
    main, other = _add_operands_8bit(integer)
    assert main == (True, False)
    assert not any(c.op.name == "annotation.stop_fusion" for c in calls(integer))


def test_plain_build_of_a_residual_block_equals_to_integer():
    _host_isa()
    mod, inputs = _residual_block(downsample=True)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm_tcutils.host_target())
    runner = measure.graph_module(lib, inputs)
    runner.run()
    np.testing.assert_array_equal(measure.outputs(runner)[0], _run_integer(to_integer(mod), inputs))
    # One conv kernel ends in the add (the main branch); the downsampling conv's kernel writes 8 bits.
    kernels = re.findall(r'"func_name": "([^"]+)"', lib.get_graph_json())
    convs = [k for k in kernels if "conv2d" in k]
    assert len(convs) == 2
    graph = json.loads(lib.get_graph_json())
    dtypes = graph["attrs"]["dltype"][1]
    conv_out = [dtypes[graph["node_row_ptr"][i]] for i, n in enumerate(graph["nodes"])
                if n["op"] == "tvm_op" and "conv2d" in n["attrs"]["func_name"]]
    assert conv_out == ["uint8", "uint8"], conv_out


def test_model_input_is_quantized_in_a_kernel_of_its_own(outputs):
    # Quantizing the float input is vectorized over rows when it is not fused with the first conv's
    # padding and packing (which move single pixels).
    _host_isa()
    _, kernels, _ = outputs("qdq_channel", "package")
    assert kernels[0].endswith("fused_divide_clip_add_reinterpret_add_cast"), kernels
    assert "pad" in kernels[1] and "layout_transform" in kernels[1], kernels


def test_8_bit_results_are_narrowed_as_the_cpu_stores_them_fastest(outputs):
    # A truncating vpmovdb that writes memory is several times slower than vpmovdb to a register plus a
    # store on Zen 4; LLVM folds the store into it when the last add before the 8-bit cast is a multiple
    # of 256, which fast_forms.rounded_int32 avoids. On targets with a tile engine or AVX-512BW
    # dotprod.rounding.narrow_directly gives the folded form back, and runs of consecutive vectors narrow
    # by the saturating packs instead (dotprod.rounding.narrow_by_packs): the folded store is left to a
    # loop's odd last vector.
    from tvm_tcutils.dotprod import rounding

    isa = _host_isa()
    direct = rounding.narrowing(tvm_tcutils.host_target())[0]
    if isa.name != "x86_vnni":
        pytest.skip(f"AVX-512 code only (host ISA {isa.name})")
    _, _, asm = outputs("qdq_channel", "package")
    kernel, stores, packs = None, {}, {}
    for line in asm.split("\n"):
        if line.endswith(":") and not line.startswith("."):
            kernel = line                     # a kernel; its parallel lambdas follow it
        elif kernel and "conv2d_NCHWc" in kernel and re.match(r"\s+vpmovdb\s", line):
            stores.setdefault(kernel, []).append(bool(re.search(r", -?\d*\(%", line)))
        elif kernel and "conv2d_NCHWc" in kernel and re.match(r"\s+vpackuswb\s", line):
            packs[kernel] = packs.get(kernel, 0) + 1
    assert len(set(stores) | set(packs)) == CONVS, (list(stores), list(packs))
    assert all(all(to_memory) == direct and any(to_memory) == direct for to_memory in stores.values()), stores
    assert bool(packs) == direct, packs
