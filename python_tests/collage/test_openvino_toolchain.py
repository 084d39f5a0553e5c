"""The openvino / openvino-bf16 toolchains: every claimed op runs as TVM computes it, models build,
save, reload and run, and a missing OpenVINO is a clear error."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import run_cli, run_python, small_conv_net
from tvm_tcutils.collage.toolchains import openvino, relay_to_onnx

pytest.importorskip("openvino", reason="openvino is not installed (pip install 'tvm-tcutils[openvino]')")

_RNG = np.random.default_rng(7)


def _const(*shape: int, scale: float = 0.3) -> relay.Constant:
    return relay.const((_RNG.standard_normal(shape) * scale).astype("float32"))


def _unary(build: Callable, shape=(2, 3, 4), positive=False):
    """A one-input case: ``build(x)``; ``positive`` inputs for ops defined on (0, inf)."""
    return build, [shape], positive


def _binary(build: Callable, positive=False):
    # The second operand broadcasts, so broadcasting is checked too.
    return build, [(2, 3, 4), (3, 4)], positive


#: One small call per claimed operator: op name -> (builder of the inputs, input shapes, positive inputs).
CASES: Dict[str, Tuple[Callable, List[tuple], bool]] = {
    "add": _binary(relay.add),
    "subtract": _binary(relay.subtract),
    "multiply": _binary(relay.multiply),
    "divide": _binary(relay.divide, positive=True),
    "power": _binary(relay.power, positive=True),
    "maximum": _binary(relay.maximum),
    "minimum": _binary(relay.minimum),
    "nn.relu": _unary(relay.nn.relu),
    "sigmoid": _unary(relay.sigmoid),
    "tanh": _unary(relay.tanh),
    "erf": _unary(relay.erf),
    "exp": _unary(relay.exp),
    "log": _unary(relay.log, positive=True),
    "sqrt": _unary(relay.sqrt, positive=True),
    "rsqrt": _unary(relay.rsqrt, positive=True),
    "negative": _unary(relay.negative),
    "abs": _unary(relay.abs),
    "copy": _unary(lambda x: relay.tanh(relay.copy(x))),
    "nn.dropout": _unary(lambda x: relay.tanh(relay.nn.dropout(x))),
    "nn.leaky_relu": _unary(lambda x: relay.nn.leaky_relu(x, alpha=0.1)),
    "nn.lrn": _unary(lambda x: relay.nn.lrn(x, size=5, axis=1, alpha=1e-2, beta=0.75, bias=2.0), (1, 7, 6, 6)),
    "nn.conv2d": _unary(lambda x: relay.nn.conv2d(x, _const(6, 2, 3, 3), padding=(1, 1), strides=(2, 2),
                                                  groups=2, channels=6, kernel_size=(3, 3)), (1, 4, 9, 9)),
    "nn.dense": _unary(lambda x: relay.nn.dense(x, _const(8, 16)), (4, 16)),
    "nn.matmul": _unary(lambda x: relay.nn.matmul(x, _const(16, 8)), (4, 16)),
    "nn.batch_matmul": (relay.nn.batch_matmul, [(2, 4, 8), (2, 6, 8)], False),
    "nn.bias_add": _unary(lambda x: relay.nn.bias_add(x, _const(4)), (1, 4, 3, 3)),
    "nn.softmax": _unary(lambda x: relay.nn.softmax(x, axis=1)),
    "nn.layer_norm": _unary(lambda x: relay.nn.layer_norm(x, _const(4) + relay.const(1.0), _const(4))),
    "nn.batch_norm": _unary(lambda x: relay.nn.batch_norm(
        x, _const(4), _const(4), _const(4), relay.abs(_const(4)) + relay.const(0.5))[0], (1, 4, 3, 3)),
    "nn.max_pool2d": _unary(lambda x: relay.nn.max_pool2d(x, (3, 3), (2, 2), padding=(1, 1)), (1, 2, 7, 7)),
    "nn.avg_pool2d": _unary(lambda x: relay.nn.avg_pool2d(x, (3, 3), (2, 2), padding=(1, 1)), (1, 2, 7, 7)),
    "nn.global_avg_pool2d": _unary(relay.nn.global_avg_pool2d, (1, 2, 5, 5)),
    "nn.global_max_pool2d": _unary(relay.nn.global_max_pool2d, (1, 2, 5, 5)),
    "nn.batch_flatten": _unary(lambda x: relay.tanh(relay.nn.batch_flatten(x))),
    "nn.pad": _unary(lambda x: relay.nn.pad(x, ((0, 0), (1, 2), (0, 1)), 0.5)),
    "reshape": _unary(lambda x: relay.tanh(relay.reshape(x, (6, 4)))),
    "transpose": _unary(lambda x: relay.transpose(x, (2, 0, 1))),
    "concatenate": _unary(lambda x: relay.concatenate([relay.tanh(x), relay.exp(x)], axis=1)),
    "clip": _unary(lambda x: relay.clip(x, -0.5, 0.7)),
    "mean": _unary(lambda x: relay.mean(x, axis=1, keepdims=True)),
    "sum": _unary(lambda x: relay.sum(x, axis=(0, 2))),
    "max": _unary(lambda x: relay.max(x, axis=2)),
    "min": _unary(lambda x: relay.min(x, axis=1)),
    "variance": _unary(lambda x: relay.variance(x, axis=2, unbiased=True)),
    "strided_slice": _unary(lambda x: relay.strided_slice(x, (0, 1, 0), (2, 3, 4), (1, 1, 2))),
    "squeeze": _unary(lambda x: relay.squeeze(x, axis=[0]), (1, 3, 4)),
    "expand_dims": _unary(lambda x: relay.expand_dims(x, 1)),
    # Scaled so that truncation to integers is exercised; exact in f32.
    "cast": _unary(lambda x: relay.cast(relay.multiply(x, relay.const(10.0)), "int32")),
    # int8 models (a quantize and a dequantize each, so that the result is float); more cases, 8-bit
    # partition boundaries and the moving ops on 8-bit tensors: test_collage_int8.py.
    "qnn.quantize": _unary(lambda x: relay.qnn.op.dequantize(relay.qnn.op.quantize(
        x, relay.const(0.05), relay.const(3), out_dtype="int8"), relay.const(0.05), relay.const(3))),
    "qnn.dequantize": _unary(lambda x: relay.qnn.op.dequantize(relay.qnn.op.quantize(
        x, relay.const(np.full(3, 0.04, "float32")), relay.const(128), axis=1, out_dtype="uint8"),
        relay.const(np.full(3, 0.04, "float32")), relay.const(128), axis=1)),
}

#: Ops whose bf16 result is not comparable with f32 within a tolerance: truncating to an integer
#: turns a bf16 rounding of the operand into a difference of one.
_NOT_BF16 = frozenset({"cast"})


def _claimed() -> List[str]:
    prefix = f"{openvino.COMPILER}."
    return sorted(name.removeprefix(prefix) for name, _, _ in openvino.pattern_table())


def _case(op: str):
    build, shapes, positive = CASES[op]
    params = [relay.var(f"x{i}", shape=shape) for i, shape in enumerate(shapes)]
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, build(*params))))
    inputs = {}
    for var, shape in zip(params, shapes):
        data = np.random.default_rng(len(inputs)).standard_normal(shape).astype("float32")
        inputs[var.name_hint] = np.abs(data) + 0.5 if positive else data
    return mod, inputs


def _build_and_run(mod, inputs) -> np.ndarray:
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm")
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**inputs)
    runner.run()
    return runner.get_output(0).numpy()


def _ops_left(mod) -> set:
    left = set()

    def visit(expr):
        if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
            left.add(expr.op.name)

    relay.analysis.post_order_visit(mod["main"], visit)
    return left


def _compilers(mod) -> List[str]:
    return sorted(str(f.attrs["Compiler"]) for _, f in mod.functions.items()
                  if f.attrs is not None and "Compiler" in f.attrs)


def test_every_claimed_op_has_a_numerics_case():
    # The claim is exactly the converter's table less what OpenVINO does not run, and each is tested.
    assert _claimed() == sorted(set(relay_to_onnx.CONVERTERS) - set(openvino.NOT_RUN))
    assert sorted(CASES) == _claimed()


@functools.lru_cache(maxsize=None)
def _reference(op: str):
    """``(module, inputs, TVM's output)`` of an op's case, built once for both precisions."""
    mod, inputs = _case(op)
    return mod, inputs, _build_and_run(mod, inputs)


def _check_op(op: str, precision: str) -> None:
    mod, inputs, expected = _reference(op)
    parted = openvino.partition_for(mod, precision=precision)
    assert _compilers(parted) == [openvino.PRECISIONS[precision].compiler]
    assert op not in _ops_left(parted)  # claimed and given to OpenVINO
    found = _build_and_run(parted, inputs)
    assert found.dtype == expected.dtype and found.shape == expected.shape
    np.testing.assert_allclose(found, expected, **openvino.PRECISIONS[precision].tolerance)


@pytest.mark.parametrize("op", sorted(CASES))
def test_claimed_op_matches_tvm_in_f32(op):
    _check_op(op, "f32")


_BF16 = openvino.available("bf16")


@pytest.mark.skipif(not _BF16[0], reason=f"no bf16 here: {_BF16[1]}")
@pytest.mark.parametrize("op", sorted(set(CASES) - _NOT_BF16))
def test_claimed_op_matches_tvm_in_bf16_within_the_stated_tolerance(op):
    _check_op(op, "bf16")


def _mlp():
    x = relay.var("data", shape=(4, 64))
    h = relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, _const(128, 64, scale=0.1)), _const(128)))
    h = relay.nn.dense(h, _const(10, 128, scale=0.1))
    y = relay.nn.softmax(h)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


@pytest.mark.parametrize("precision", ["f32", pytest.param("bf16", marks=pytest.mark.skipif(
    not _BF16[0], reason=f"no bf16 here: {_BF16[1]}"))])
def test_whole_model_partitioned_greedily_matches_tvm(precision):
    mod = small_conv_net(channels=8, size=8)
    var = mod["main"].params[0]
    inputs = {var.name_hint: np.random.default_rng(0).standard_normal(
        [int(d) for d in var.checked_type.shape]).astype("float32")}
    parted = openvino.partition_for(mod, precision=precision)
    assert _compilers(parted) == [openvino.PRECISIONS[precision].compiler]
    assert not _ops_left(parted)  # every op of the model runs in OpenVINO
    np.testing.assert_allclose(_build_and_run(parted, inputs), _build_and_run(mod, inputs),
                               **openvino.PRECISIONS[precision].tolerance)


def test_saved_partitioned_module_reloads_and_runs_with_the_same_outputs(tmp_path):
    from tvm_tcutils.models import load_model, save_model

    mod = _mlp()
    data = {"data": np.random.default_rng(3).standard_normal((4, 64)).astype("float32")}
    parted = openvino.partition_for(mod)
    before = _build_and_run(parted, data)
    path = str(tmp_path / "parted.json")
    save_model(path, parted)
    code = f"""
import numpy as np, tvm, tvm_tcutils
from tvm import relay
from tvm.contrib import graph_executor
mod, params = tvm_tcutils.models.load_model({path!r})
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target="llvm", params=params)
g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
g.set_input("data", np.load({str(tmp_path / 'data.npy')!r})); g.run()
np.save({str(tmp_path / 'out.npy')!r}, g.get_output(0).numpy())
"""
    np.save(tmp_path / "data.npy", data["data"])
    # Another process (forked from the tests' fork server, which never compiled these models): OpenVINO
    # compiles the embedded models again there.
    result = run_python(code, fresh=False)
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), before)
    loaded, _ = load_model(path)
    assert _compilers(loaded) == _compilers(parted)


def test_compiled_once_per_partition_and_tuple_results_bind_in_order():
    x, y = relay.var("x", shape=(3, 4)), relay.var("y", shape=(5,))
    w = np.arange(16, dtype="float32").reshape(4, 4) / 16
    body = relay.Tuple([relay.nn.dense(x, relay.const(w)), relay.sigmoid(y)])
    func = relay.Function([x, y], body).with_attr("global_symbol", "tcutils_openvino_tuple")
    module = openvino.compile_function(func)
    toolchain = openvino.TOOLCHAINS["f32"]
    before = toolchain.cached()
    xd = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
    yd = np.linspace(-2, 2, 5).astype("float32")
    for _ in range(2):  # the second call reuses the compiled model and the bound tensors
        outs = [tvm.nd.empty((3, 4), "float32"), tvm.nd.empty((5,), "float32")]
        module["tcutils_openvino_tuple"](tvm.nd.array(xd), tvm.nd.array(yd), *outs)
        np.testing.assert_allclose(outs[0].numpy(), xd @ w.T, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[1].numpy(), 1 / (1 + np.exp(-yd)), rtol=1e-6)
    assert toolchain.cached() - before <= 1


def test_inputs_are_read_in_place():
    # Zero copy: the infer request reads the caller's buffer, so a change between calls is seen.
    x = relay.var("x", shape=(8,))
    module = openvino.compile_function(relay.Function([x], relay.negative(x)).with_attr("global_symbol", "neg"))
    data, out = tvm.nd.array(np.ones(8, "float32")), tvm.nd.empty((8,), "float32")
    module["neg"](data, out)
    data.copyfrom(np.full(8, 3.0, "float32"))
    module["neg"](data, out)
    assert out.numpy().tolist() == [-3.0] * 8


def test_toolchains_and_threads():
    from tvm_tcutils.collage.toolchains import known, resolve

    assert [tc.name for tc in resolve("tvm,openvino")] == ["tvm", "openvino"]
    assert known()["openvino-bf16"].availability()[0] == _BF16[0]
    assert openvino.compile_config("f32")["INFERENCE_PRECISION_HINT"] == "f32"
    assert openvino.compile_config()["INFERENCE_NUM_THREADS"] == openvino.openvino_threads()


def test_bad_thread_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TVM_TCUTILS_OPENVINO_THREADS", "many")
    with pytest.raises(ValueError, match="TVM_TCUTILS_OPENVINO_THREADS must be a positive integer"):
        openvino.openvino_threads()


def test_missing_openvino_names_the_extra():
    code = """
import sys
sys.modules["openvino"] = None  # as if it were not installed
import tvm, tvm_tcutils
from tvm import relay
from tvm_tcutils.collage.toolchains import openvino, resolve
print("AVAILABLE", *openvino.available())
print("TABLE", relay.op.contrib.get_pattern_table("tcutils_openvino"))
try:
    resolve("tvm,openvino")
except ValueError as err:
    print("RESOLVE", err)
x = relay.var("x", shape=(2,))
try:
    openvino.compile_function(relay.Function([x], relay.tanh(x)).with_attr("global_symbol", "f"))
except RuntimeError as err:
    print("ERROR", err)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    hint = "pip install 'tvm-tcutils[openvino]'"
    assert f"AVAILABLE False openvino not installed; install with: {hint}" in result.stdout
    assert "TABLE None" in result.stdout
    assert "RESOLVE toolchains: 'openvino' is not available here (openvino not installed" in result.stdout
    assert f"ERROR toolchain openvino is unavailable: openvino not installed; install with: {hint}" in result.stdout


def test_collage_list():
    result = run_cli("collage", "--list")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "installed" in lines["openvino"] and "buildable" in lines["openvino"]
    assert "openvino-bf16" in lines and "ort" in lines and "tvm" in lines


def test_lifted_weights_become_constants_of_the_compiled_model():
    # 2 x 128 KiB weights: lifted into TVM's parameters, out of the payload, constants again in OpenVINO.
    rng = np.random.default_rng(6)
    w1, w2 = (rng.standard_normal((128, 256)).astype("float32") / 16 for _ in range(2))
    x = relay.var("data", shape=(2, 256))
    body = relay.nn.dense(relay.tanh(relay.nn.dense(x, relay.const(w1))), relay.const(w2.T.copy()))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], body)))
    parted = openvino.partition_for(mod)
    (func,) = [f for gv, f in parted.functions.items() if gv.name_hint != "main"]
    assert [p.name_hint for p in func.params][1:] == ["tcutils_lifted_0", "tcutils_lifted_1"]
    assert len(openvino.ort.to_payload(func, externalize=False)) < 4096
    data = rng.standard_normal((2, 256)).astype("float32")
    np.testing.assert_allclose(_build_and_run(parted, {"data": data}), np.tanh(data @ w1.T) @ w2,
                               **openvino.F32_TOLERANCE)
