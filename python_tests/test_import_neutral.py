"""Importing tvm_tcutils changes nothing for float models: same graph, same outputs."""
import json

import numpy as np

from conftest import run_python

_PROGRAM = r"""
import hashlib, json, sys
import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor
if sys.argv[1] == "with":
    import tvm_tcutils  # noqa: F401
import tvm.relay.testing

def build(mod, params):
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", params=params)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    shape = [int(d) for d in mod["main"].params[0].checked_type.shape]
    runner.set_input(mod["main"].params[0].name_hint, np.random.default_rng(0).standard_normal(shape).astype("float32"))
    runner.run()
    return lib.get_graph_json(), runner.get_output(0).numpy()

def small_net():
    rng = np.random.default_rng(0)
    const = lambda *shape: relay.const(rng.standard_normal(shape).astype("float32") * 0.2)
    x = relay.var("data", shape=(1, 8, 16, 16))
    y = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, const(16, 8, 3, 3), padding=(1, 1), channels=16, kernel_size=(3, 3)), const(16)))
    z = relay.nn.conv2d(y, const(16, 16, 3, 3), padding=(1, 1), channels=16, kernel_size=(3, 3))
    z = relay.nn.max_pool2d(relay.nn.relu(relay.add(z, y)), pool_size=(2, 2), strides=(2, 2))
    z = relay.nn.dense(relay.nn.batch_flatten(relay.nn.global_avg_pool2d(z)), const(10, 16))
    return tvm.IRModule.from_expr(relay.Function([x], z)), {}

result = {}
for name, (m, p) in {"small_conv_net": small_net(), "mlp": relay.testing.mlp.get_workload(batch_size=2)}.items():
    m = relay.transform.InferType()(m)
    graph, out = build(m, p)
    result[name] = {"graph": hashlib.sha256(graph.encode()).hexdigest(), "ir": m.astext(show_meta_data=False),
                    "out": out.ravel().tolist()}
# ConvertLayout, which the package hooks, without a LayoutConfig scope: TVM's result.
mod, _ = relay.testing.resnet.get_workload(num_layers=18)
for layout in ("NHWC", "HWNC", "NCHW"):
    with tvm.transform.PassContext(opt_level=3):
        converted = relay.transform.ConvertLayout({"nn.conv2d": [layout, "default"]})(relay.transform.InferType()(mod))
    result["resnet18_" + layout] = {"ir": converted.astext(show_meta_data=False)}
print(json.dumps(result))
"""


def _run(mode):
    proc = run_python(_PROGRAM.replace("sys.argv[1]", repr(mode)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_float_models_compile_the_same_with_and_without_the_package():
    without, with_package = _run("without"), _run("with")
    assert set(without) == set(with_package) == {"small_conv_net", "mlp", "resnet18_NHWC", "resnet18_HWNC", "resnet18_NCHW"}
    for name in without:
        assert with_package[name]["ir"] == without[name]["ir"], name
        if "graph" in without[name]:
            assert with_package[name]["graph"] == without[name]["graph"], name
            np.testing.assert_array_equal(np.array(with_package[name]["out"]), np.array(without[name]["out"]))
