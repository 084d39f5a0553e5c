"""Models the benchmarks bring as users have them: old ONNX files and the onnx package's light models.

Files written before ONNX IR version 4 list their weights among the graph's inputs, and the light
models make each weight with a ``ConstantOfShape`` (one value repeated); onnxruntime's quantizer
can use neither as it is.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tvm_tcutils.bench.int8 import is_quantized, ort_quantized  # noqa: E402
from tvm_tcutils.bench.int8_models import feed_of  # noqa: E402
from tvm_tcutils.bench.models import light_model, light_model_names, with_random_weights  # noqa: E402
from tvm_tcutils.models import onnx_graph_inputs  # noqa: E402


def _old_style_file(path: str, seed: int) -> str:
    """A conv + batch norm + relu model in IR version 3: every initializer is also a graph input."""
    rng = np.random.default_rng(seed)
    weights = {
        "w": rng.normal(0, 0.3, (8, 4, 3, 3)), "b": rng.normal(0, 0.1, 8), "scale": rng.uniform(0.5, 1.5, 8),
        "shift": rng.normal(0, 0.1, 8), "mean": rng.normal(0, 0.1, 8), "var": rng.uniform(0.5, 1.5, 8),
    }
    inits = [numpy_helper.from_array(v.astype("float32"), k) for k, v in weights.items()]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])]
    inputs += [helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)) for i in inits]
    graph = helper.make_graph(nodes, "old", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 3
    onnx.save(model, path)
    return path


def test_fed_inputs_leave_out_the_weights_listed_among_them(tmp_path):
    path = _old_style_file(str(tmp_path / "old.onnx"), 0)
    assert onnx.load(path).graph.input[0].name == "x" and len(onnx.load(path).graph.input) == 7
    assert [v.name for v in onnx_graph_inputs(onnx.load(path).graph)] == ["x"]
    assert list(feed_of(path)) == ["x"]


def test_an_old_file_is_quantized_as_onnxruntimes_guide_prepares_it(tmp_path):
    path = _old_style_file(str(tmp_path / "old.onnx"), 0)
    files = ort_quantized(path, calibration=2, cache_dir=str(tmp_path / "cache"))
    float_model = onnx.load(files["fp32"])
    # Only the image is an input; the batch norm is folded into the conv (quant_pre_process).
    assert [v.name for v in float_model.graph.input] == ["x"]
    assert "BatchNormalization" not in {n.op_type for n in float_model.graph.node}
    qdq = onnx.load(files["qdq"])
    ops = [n.op_type for n in qdq.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and "BatchNormalization" not in ops
    assert is_quantized(files["qdq"]) and not is_quantized(files["fp32"]) and not is_quantized(path)
    # A quantized file given as the model is refused, not quantized again.
    with pytest.raises(ValueError, match="already quantized"):
        ort_quantized(files["qdq"], calibration=2, cache_dir=str(tmp_path / "cache"))
    # What the contenders run computes the user's model.
    import onnxruntime as ort

    feed = {"x": np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = ort.InferenceSession(files["fp32"], providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_two_files_of_one_name_get_their_own_quantized_files(tmp_path):
    cache = str(tmp_path / "cache")
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    first = ort_quantized(_old_style_file(str(tmp_path / "a" / "m.onnx"), 0), calibration=2, cache_dir=cache)
    second = ort_quantized(_old_style_file(str(tmp_path / "b" / "m.onnx"), 1), calibration=2, cache_dir=cache)
    assert first["qdq"] != second["qdq"] and first["fp32"] != second["fp32"]


def test_random_weights_are_drawn_by_role_and_the_graph_checks():
    names = light_model_names()
    if "squeezenet" not in names:
        pytest.skip("this onnx package ships no light models")
    model = onnx.load(light_model("squeezenet", weights="random"))
    onnx.checker.check_model(model)
    assert "ConstantOfShape" not in {n.op_type for n in model.graph.node}
    assert [v.name for v in model.graph.input] == [v.name for v in onnx_graph_inputs(model.graph)]
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    kernel = weights[conv.input[1]]
    # He-normal: spread over the values (one repeated value would give every channel one scale).
    assert kernel.std() == pytest.approx(np.sqrt(2.0 / np.prod(kernel.shape[1:])), rel=0.2)
    assert len(np.unique(kernel)) > kernel.size // 2


def test_random_weights_leave_a_model_without_filled_weights_as_it_was():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    assert with_random_weights(model).graph == model.graph


def test_light_model_names_the_choices():
    with pytest.raises(ValueError, match="weights must be one of filled, random"):
        light_model("squeezenet", weights="trained")


def test_the_reduce_range_route_has_7_bit_weights_and_others_are_refused(tmp_path, monkeypatch):
    # What onnxruntime's guide has users on CPUs without VNNI quantize: weights vpmaddubsw cannot saturate.
    from tvm_tcutils.bench import int8, int8_models

    monkeypatch.setattr(int8, "QUANTIZED_CACHE", str(tmp_path / "cache"))
    files = int8_models.model_files(_old_style_file(str(tmp_path / "m.onnx"), 0), routes=["qdq", "qdq-rr"])
    assert list(files) == ["qdq", "qdq-rr"] and files["qdq"] != files["qdq-rr"]

    def widest(path):
        return max(int(np.abs(numpy_helper.to_array(t).astype(int)).max())
                   for t in onnx.load(path).graph.initializer if t.data_type == TensorProto.INT8)

    assert widest(files["qdq-rr"]) <= 64 < widest(files["qdq"])
    with pytest.raises(ValueError, match="routes must be among"):
        int8_models.model_files("resnet-50-onnx", routes=["qdq-7bit"])
