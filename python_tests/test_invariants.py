"""Package-wide invariant: importing tvm_tcutils changes nothing it does not take over.

One program runs twice, concurrently (one interpreter per core): once after
``import tvm_tcutils`` (all hooks installed), once with only the bare package
importable (``tvm_tcutils.models`` without ``__init__``, so no hook). Both must
give the same results for float models, which the package leaves to TVM:

* the same graph and bit-identical outputs of ``relay.build`` on plain
  ``llvm`` and on this CPU's own target (where the int8 dot-product hooks are
  installed and its code runs here), for a small net with every common float
  op (strided stem, residual, 1x1 strided conv, concatenation, pools, dense)
  and the zoo MLP;
* the same graph and outputs for a QDQ model (``quantize`` / ``dequantize`` around a conv) built for
  plain ``llvm``: the ``FTVMQnnLegalize`` hook of ``qnn.quantize`` (plain ``relay.build`` of QDQ models,
  ``python_tests/dotprod/test_plain_relay_build.py``) leaves targets without a dot-product ISA to TVM;
* the same ``relay.optimize`` result for ``cuda -arch=sm_80`` (the tensor-core
  hooks' target; no GPU needed);
* the same ``ConvertLayout`` result on ResNet-18 for NHWC, HWNC and NCHW (the
  package's conversion handler without a :class:`LayoutConfig` scope).

This replaces the former per-capability copies of the same check
(``test_import_neutral.py``, the float-model tests of ``dotprod/test_hooks.py``
and ``tensorcore/test_strategy.py``).
"""
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tvm_tcutils

from conftest import run_python

_PROGRAM = r"""
import hashlib, json, re, sys
mode, host = sys.argv[1], sys.argv[2]
if mode == "with":
    import tvm_tcutils  # noqa: F401  (installs every hook)
else:
    import importlib.util
    spec = importlib.util.find_spec("tvm_tcutils")
    pkg = importlib.util.module_from_spec(spec)
    pkg.__path__ = spec.submodule_search_locations
    sys.modules["tvm_tcutils"] = pkg  # bare package: __init__ (and register()) not run
import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor
from tvm_tcutils.models import load_model, random_inputs

def small_net():
    rng = np.random.default_rng(0)
    const = lambda *shape: relay.const(rng.standard_normal(shape).astype("float32") * 0.2)
    conv = lambda x, w, **kw: relay.nn.conv2d(x, const(*w), channels=w[0], kernel_size=w[2:], **kw)
    x = relay.var("data", shape=(1, 3, 32, 32))
    y = relay.nn.relu(relay.nn.bias_add(conv(x, (16, 3, 7, 7), strides=(2, 2), padding=(3, 3)), const(16)))
    z = relay.nn.relu(relay.add(conv(y, (16, 16, 3, 3), padding=(1, 1)), y))
    z = relay.nn.max_pool2d(z, pool_size=(2, 2), strides=(2, 2))
    fire = relay.concatenate([conv(z, (8, 16, 1, 1)), conv(z, (8, 16, 3, 3), padding=(1, 1))], axis=1)
    z = relay.nn.relu(conv(fire, (32, 16, 1, 1), strides=(2, 2)))
    z = relay.nn.dense(relay.nn.batch_flatten(relay.nn.global_avg_pool2d(z)), const(10, 32))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], z))), {}

def qdq_net():
    rng = np.random.default_rng(1)
    q = lambda y, s, z: relay.qnn.op.quantize(y, relay.const(s), relay.const(z), out_dtype="uint8")
    dq = lambda y, s, z: relay.qnn.op.dequantize(y, relay.const(s), relay.const(z))
    x = relay.var("data", shape=(1, 8, 12, 12))
    w = relay.const(rng.integers(-127, 128, (16, 8, 3, 3)).astype("int8"))
    y = relay.nn.conv2d(dq(q(x, 0.03, 128), 0.03, 128), dq(w, 0.01, 0), channels=16, kernel_size=(3, 3),
                        padding=(1, 1))
    y = dq(q(relay.nn.relu(y), 0.05, 0), 0.05, 0)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y))), {}

def attention_net():
    # A float encoder's ops the package's FTVMQnnLegalize hooks see in quantized models only: the products of
    # two activations (batch_matmul), softmax, and a layer norm as TVM's importer writes it (mean, variance).
    rng = np.random.default_rng(2)
    x = relay.var("data", shape=(2, 32, 16))
    w = relay.const(rng.standard_normal((2, 16, 16)).astype("float32") * 0.2)
    h = relay.nn.batch_matmul(x, w)
    scores = relay.nn.softmax(relay.nn.batch_matmul(h, x), axis=-1)
    y = relay.add(relay.nn.batch_matmul(scores, x, transpose_b=False), x)
    mean = relay.mean(y, axis=-1, keepdims=True)
    var = relay.variance(y, axis=-1, keepdims=True, with_mean=mean)
    y = relay.divide(relay.subtract(y, mean), relay.sqrt(relay.add(var, relay.const(1e-5))))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y))), {}

state = getattr(tvm, "_tvm_tcutils_state", {})
result = {"hooks": len(state.get("installed", {})),
          "quantize_hook": tvm.ir.Op.get("qnn.quantize").get_attr("FTVMQnnLegalize") is not None}
mlp = load_model("mlp")
for name, (mod, params), target in [
    ("net/llvm", small_net(), "llvm"), ("net/host", small_net(), host), ("mlp/host", mlp, host),
    ("qdq/llvm", qdq_net(), "llvm"), ("attention/host", attention_net(), host),
]:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**random_inputs(mod, params))
    runner.run()
    result[name] = {"graph": hashlib.sha256(lib.get_graph_json().encode()).hexdigest(),
                    "out": runner.get_output(0).numpy().ravel().tolist()}
with tvm.transform.PassContext(opt_level=3):
    optimized, _ = relay.optimize(small_net()[0], target="cuda -arch=sm_80")
# Targets print with their object address: the one part that differs between two processes.
result["net/cuda"] = {"ir": re.sub(r"Target\(id=[0-9a-f]+", "Target(", optimized.astext(show_meta_data=False))}
resnet, _ = load_model("resnet-18")
for layout in ("NHWC", "HWNC", "NCHW"):
    with tvm.transform.PassContext(opt_level=3):
        converted = relay.transform.ConvertLayout({"nn.conv2d": [layout, "default"]})(resnet)
    result["resnet18/" + layout] = {"ir": converted.astext(show_meta_data=False)}
print(json.dumps(result))
"""

CASES = ["net/llvm", "net/host", "mlp/host", "qdq/llvm", "attention/host", "net/cuda", "resnet18/NHWC", "resnet18/HWNC", "resnet18/NCHW"]


def _run(mode: str) -> dict:
    code = _PROGRAM.replace("sys.argv[1], sys.argv[2]", repr((mode, tvm_tcutils.host_target())))
    # "with": forked from the tests' fork server, a process that has imported the package (every hook
    # installed) as the program's own import does; "without" needs a fresh interpreter that never imports it.
    proc = run_python(code, timeout=280, fresh=mode == "without")
    assert proc.returncode == 0, f"{mode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def both() -> dict:
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(("without", "with"), pool.map(_run, ("without", "with"))))


def test_bare_package_installs_no_hooks_and_import_installs_them(both):
    assert both["without"]["hooks"] == 0
    assert both["with"]["hooks"] > 0
    # The hook behind plain relay.build of QDQ models is one of them (TVM has none there).
    assert not both["without"]["quantize_hook"] and both["with"]["quantize_hook"]


@pytest.mark.parametrize("case", CASES)
def test_float_model_compiles_the_same_with_and_without_the_package(both, case):
    without, with_package = both["without"][case], both["with"][case]
    assert set(without) == set(with_package)
    if "ir" in without:
        assert with_package["ir"] == without["ir"]
    if "graph" in without:
        assert with_package["graph"] == without["graph"]
        np.testing.assert_array_equal(np.array(with_package["out"]), np.array(without["out"]))
