"""ONNX models built in code: valid graphs, realistic activations, TVM's import agrees with onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils import models

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def _ort_run(model, data):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": data})[0]


def _input(model, seed=0):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_small_bert_imports_into_relay_with_the_same_numerics(small_bert_onnx):
    model, mod, params = small_bert_onnx
    data = _input(model)
    ops = set()
    relay.analysis.post_order_visit(mod["main"], lambda e: ops.add(e.op.name) if isinstance(e, relay.Call) else None)
    # The operator kinds the Collage benchmark is about.
    assert {"nn.dense", "nn.batch_matmul", "nn.softmax", "erf", "variance"} <= ops
    with tvm.transform.PassContext(opt_level=3):
        got = relay.create_executor("graph", mod=mod, target="llvm", params=params).evaluate()(data).numpy()
    np.testing.assert_allclose(got, _ort_run(model, data), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, convs", [("resnet-50-onnx", 53), ("resnet-18-onnx", 20), ("mobilenet-v2-onnx", 52)])
def test_cnn_graphs_have_realistic_activations(name, convs):
    model = models.onnx_model(name)
    assert sum(node.op_type == "Conv" for node in model.graph.node) == convs
    out = _ort_run(model, _input(model))
    assert out.shape == (1, 1000)
    # He-style weights: logits neither vanish towards denormals nor blow up.
    assert 0.05 < float(out.std()) < 50.0 and np.isfinite(out).all()


def test_bert_is_the_issue_configuration():
    model = models.onnx_model("bert-tiny-onnx")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 128, 256]
    assert sum(node.op_type == "LayerNormalization" for node in model.graph.node) == 8
    assert sum(node.op_type == "Softmax" for node in model.graph.node) == 4
    out = _ort_run(model, _input(model))
    assert abs(float(out.std()) - 1.0) < 0.05  # layer-normalized output


def test_onnx_models_are_zoo_names_and_bad_requests_fail_clearly():
    for name in models.ONNX_BUILDERS:
        assert name in models.zoo_names()
    with pytest.raises(models.ModelError, match="built-in ONNX models"):
        models.onnx_model("bert-huge")
    with pytest.raises(models.ModelError, match="multiple of heads"):
        models.bert_onnx(hidden=30, heads=4)
    with pytest.raises(models.ModelError, match="float32 only"):
        models.load_model("mobilenet-v2-onnx", dtype="float16")
