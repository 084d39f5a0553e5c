"""Model loading: zoo names, ONNX files, saved modules, bad input."""

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils import models
from tvm_tcutils.models import ModelError, load_model, save_model


def _tiny_onnx(path):
    from tvm_tcutils._compat import ensure_onnx_mapping, onnx_model_for_ort

    onnx = ensure_onnx_mapping()
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype("float32")
    fc = rng.standard_normal((10, 8)).astype("float32")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model = onnx_model_for_ort(model)
    onnx.save(model, path)
    return model


def _run(mod, params, inputs):
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", params=params)
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**inputs)
    runner.run()
    return runner.get_output(0).numpy()


@pytest.mark.parametrize("name", ["resnet-18", "mobilenet", "squeezenet1.1", "mlp"])
def test_zoo_models_load_and_type_check(name):
    mod, params = load_model(name)
    assert mod["main"].checked_type is not None
    assert params and all(isinstance(v, tvm.nd.NDArray) for v in params.values())


@pytest.mark.slow  # 9 s (the CI budget)
def test_realistic_weights_keep_activations_out_of_denormals(resnet18_model):
    mod, params = resnet18_model
    _, zoo_params = load_model("resnet-18", weights="zoo")
    assert set(params) == set(zoo_params)
    data = models.random_inputs(mod, params)
    # Logits (before the softmax); weights stay inputs so that one build serves both sets.
    body = mod["main"].body
    logits_mod = tvm.IRModule.from_expr(relay.Function(mod["main"].params, body.args[0]))
    with tvm.transform.PassContext(opt_level=1):
        lib = relay.build(logits_mod, target="llvm")
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))

    def mean_abs(weights):
        runner.set_input(**data, **weights)
        runner.run()
        return np.abs(runner.get_output(0).numpy()).mean()

    ours, theirs = mean_abs(params), mean_abs(zoo_params)
    assert ours > 1e-3, ours
    assert ours > 100 * theirs, (ours, theirs)


def test_realistic_params_is_seeded_and_does_not_mutate(mlp_model):
    _, params = mlp_model
    before = {k: v.numpy().copy() for k, v in params.items()}
    a = models.realistic_params(params, seed=3)
    b = models.realistic_params(params, seed=3)
    c = models.realistic_params(params, seed=4)
    for k in params:
        np.testing.assert_array_equal(params[k].numpy(), before[k])
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    assert any(not np.array_equal(a[k].numpy(), c[k].numpy()) for k in params if k.endswith("weight"))


def test_onnx_model_imports_and_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = str(tmp_path / "tiny.onnx")
    _tiny_onnx(path)
    mod, params = load_model(path)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    ours = _run(mod, params, {"x": x})
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ours, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ext", [".json", ".relay"])
def test_save_and_load_round_trip(tmp_path, mlp_model, ext):
    mod, params = mlp_model
    path = str(tmp_path / f"m{ext}")
    save_model(path, mod, params)
    loaded, loaded_params = load_model(path)
    assert tvm.ir.structural_equal(loaded["main"], mod["main"], map_free_vars=True)
    assert sorted(loaded_params) == sorted(params)


def test_bad_inputs_raise_one_line_model_errors(tmp_path):
    cases = {
        "resnet-7": "built-in models: resnet-18",
        str(tmp_path / "missing.onnx"): "no such file",
        str(tmp_path / "model.xyz"): "unknown model",
    }
    (tmp_path / "broken.onnx").write_bytes(b"\x00not an onnx file")
    cases[str(tmp_path / "broken.onnx")] = "not a valid ONNX model"
    (tmp_path / "broken.json").write_text("{nope")
    cases[str(tmp_path / "broken.json")] = "not a saved Relay module"
    x = relay.var("x", shape=(2, 3))
    bad = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, relay.ones((4, 5), "float32"))))
    (tmp_path / "badtype.json").write_text(tvm.ir.save_json(bad))
    cases[str(tmp_path / "badtype.json")] = "does not type-check"
    for spec, expected in cases.items():
        with pytest.raises(ModelError) as info:
            load_model(spec)
        assert expected in str(info.value), (spec, str(info.value))
        assert "\n" not in str(info.value)
    with pytest.raises(ModelError, match="weights"):
        load_model("mlp", weights="xavier")
    with pytest.raises(ModelError, match="batch_size"):
        load_model("mlp", batch_size=0)


def test_random_inputs_cover_integer_range():
    x = relay.var("x", shape=(64, 64), dtype="int8")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], x)))
    data = models.random_inputs(mod)["x"]
    assert data.dtype == np.int8 and data.min() == -128 and data.max() == 127
