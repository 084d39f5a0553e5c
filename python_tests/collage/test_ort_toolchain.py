"""The tcutils_ort toolchain: partitioned models build and run with every executor, and export."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from conftest import run_graph_and_vm, run_python, small_conv_net
from tvm_tcutils.collage.toolchains import blas, ort

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def _attention(seq=16, hidden=32, heads=2):
    """One attention block with GELU and layer norm: the op kinds ORT is claimed to win."""
    rng = np.random.default_rng(3)

    def const(*shape):
        return relay.const((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype("float32"))

    x = relay.var("x", shape=(seq, hidden))
    q, k = relay.nn.dense(x, const(hidden, hidden)), relay.nn.dense(x, const(hidden, hidden))
    head = hidden // heads

    def split(t):
        return relay.transpose(relay.reshape(t, (seq, heads, head)), (1, 0, 2))

    scores = relay.nn.softmax(relay.nn.batch_matmul(split(q), split(k)) * relay.const(head ** -0.5))
    context = relay.reshape(relay.transpose(relay.nn.batch_matmul(scores, split(x), transpose_b=False), (1, 0, 2)),
                            (seq, hidden))
    h = relay.nn.bias_add(relay.nn.dense(context, const(hidden, hidden)), const(hidden))
    gelu = h * relay.const(0.5) * (relay.const(1.0) + relay.erf(h * relay.const(2 ** -0.5)))
    out = relay.nn.layer_norm(gelu + x, const(hidden), const(hidden))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def _inception_block():
    """Parallel convolution branches joined by concatenate (a tuple operand), then pooled."""
    rng = np.random.default_rng(4)
    x = relay.var("x", shape=(1, 8, 12, 12))

    def branch(kernel):
        w = relay.const((rng.standard_normal((4, 8, kernel, kernel)) * 0.2).astype("float32"))
        return relay.nn.relu(relay.nn.conv2d(x, w, padding=(kernel // 2,) * 2, channels=4, kernel_size=(kernel,) * 2))

    y = relay.concatenate([branch(1), branch(3), relay.nn.avg_pool2d(x, (3, 3), padding=(1, 1))], axis=1)
    y = relay.nn.global_avg_pool2d(y)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def _reference(mod, inputs):
    with tvm.transform.PassContext(opt_level=3):
        return relay.create_executor("graph", mod=mod, target="llvm").evaluate()(**inputs).numpy()


def _compilers(mod):
    return sorted(
        str(func.attrs["Compiler"]) for _, func in mod.functions.items()
        if func.attrs is not None and "Compiler" in func.attrs
    )


@pytest.mark.parametrize("model", ["conv_net", "attention", "inception_block"])
def test_partitioned_model_matches_tvm_with_graph_and_vm(model):
    mod = {"conv_net": small_conv_net, "attention": _attention, "inception_block": _inception_block}[model]()
    var = mod["main"].params[0]
    inputs = {var.name_hint: np.random.default_rng(0).standard_normal([int(d) for d in var.checked_type.shape])
              .astype("float32")}
    parted = ort.partition_for(mod)
    assert _compilers(parted) == ["tcutils_ort"]
    left = set()
    relay.analysis.post_order_visit(
        parted["main"], lambda e: left.add(e.op.name) if isinstance(e, relay.Call) and isinstance(e.op, tvm.ir.Op) else None
    )
    assert not left  # every operator of these models converts, concatenate's tuple operand included
    expected = _reference(mod, inputs)
    graph_out, vm_out = run_graph_and_vm(parted, inputs)
    np.testing.assert_allclose(graph_out, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(vm_out, expected, rtol=1e-4, atol=1e-4)


def test_mixed_partition_keeps_unsupported_ops_in_tvm():
    x = relay.var("x", shape=(4, 8))
    idx = relay.const(np.array([3, 0, 1], dtype="int32"))
    # take is not claimed: it stays in main between two ORT partitions.
    y = relay.tanh(relay.take(relay.exp(x), idx, axis=0))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    parted = ort.partition_for(mod)
    assert _compilers(parted) == ["tcutils_ort", "tcutils_ort"]
    data = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    graph_out, vm_out = run_graph_and_vm(parted, {"x": data})
    np.testing.assert_allclose(graph_out, np.tanh(np.exp(data)[[3, 0, 1]]), rtol=1e-5)
    np.testing.assert_allclose(vm_out, graph_out, rtol=1e-6)


def test_sessions_are_cached_per_model():
    mod = _attention(seq=8, hidden=16)
    parted = ort.partition_for(mod)
    data = {"x": np.ones((8, 16), "float32")}
    before = ort.TOOLCHAIN.cached()
    first, _ = run_graph_and_vm(parted, data)
    loaded = ort.TOOLCHAIN.cached() - before
    # One session per distinct partition, shared by the graph executor and the VM and by a second build.
    assert loaded == len(_compilers(parted))
    again, _ = run_graph_and_vm(parted, data)
    assert ort.TOOLCHAIN.cached() - before == loaded
    np.testing.assert_array_equal(first, again)


def _mixed_model():
    """dense (BLAS) -> tanh (ORT) -> take (TVM) -> exp, softmax (ORT)."""
    x = relay.var("data", shape=(8, 32))
    y = relay.nn.dense(x, relay.const(np.random.default_rng(2).standard_normal((16, 32)).astype("float32")))
    y = relay.take(relay.tanh(y), relay.const(np.array([3, 0, 1], "int32")), axis=0)
    y = relay.nn.softmax(relay.exp(y))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    return mod, ort.partition_for(blas.partition_for(mod))


def test_export_library_and_load_in_a_new_process(tmp_path):
    mod, parted = _mixed_model()
    assert _compilers(parted) == ["tcutils_blas", "tcutils_ort", "tcutils_ort"]
    data = np.random.default_rng(5).standard_normal((8, 32)).astype("float32")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(parted, target="llvm")
    path = str(tmp_path / "model.so")
    lib.export_library(path)
    np.save(tmp_path / "data.npy", data)
    code = f"""
import numpy as np, tvm, tvm_tcutils
from tvm.contrib import graph_executor
lib = tvm.runtime.load_module({path!r})
g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
g.set_input("data", np.load({str(tmp_path / 'data.npy')!r})); g.run()
np.save({str(tmp_path / 'out.npy')!r}, g.get_output(0).numpy())
"""
    # Forked from the fork server (TVM and the package imported, nothing of this model built or loaded):
    # another process than the one that built the library, which is what is checked.
    result = run_python(code, fresh=False)
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), _reference(mod, {"data": data}), rtol=1e-5, atol=1e-6)


def test_exported_module_needs_the_package_to_run(tmp_path):
    _, parted = _mixed_model()
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(parted, target="llvm")
    path = str(tmp_path / "model.so")
    lib.export_library(path)
    code = f"""
import numpy as np, tvm
from tvm.contrib import graph_executor
g = graph_executor.GraphModule(tvm.runtime.load_module({path!r})["default"](tvm.cpu()))
g.set_input("data", np.ones((8, 32), "float32")); g.run()
"""
    result = run_python(code)
    # Without importing tvm_tcutils the toolchains' packed functions do not exist (compiled wrappers), nor
    # the loader of the native plugin's partition modules: a clear failure naming what is missing.
    from tvm_tcutils.collage.toolchains.packed_call import native_module_maker

    missing = "tvm_tcutils.blas.run" if native_module_maker() is None else "tcutils_packed_call"
    assert result.returncode != 0 and missing in result.stderr, result.stderr[-2000:]
    # With the package imported, the same library runs, and computes what it computes here.
    here = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    here.set_input("data", np.ones((8, 32), "float32"))
    here.run()
    result = run_python("import tvm_tcutils\n" + code + "np.save({!r}, g.get_output(0).numpy())\n".format(
        str(tmp_path / "out.npy")))
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), here.get_output(0).numpy(), rtol=1e-6)


def test_missing_onnxruntime_is_reported():
    code = """
import sys
sys.modules["onnxruntime"] = None  # as if it were not installed
import tvm, tvm_tcutils
from tvm import relay
from tvm.contrib import graph_executor
from tvm_tcutils.collage.toolchains import blas, ort
ok, reason = ort.available()
print("AVAILABLE", ok, reason)
print("TABLE", relay.op.contrib.get_pattern_table("tcutils_ort"))
x = relay.var("x", shape=(2,))
f = relay.Function([x], relay.tanh(x)).with_attr("global_symbol", "f")
try:
    ort.compile_function(f)
except RuntimeError as err:
    print("ERROR", err)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "AVAILABLE False onnxruntime not installed" in result.stdout
    assert "TABLE None" in result.stdout
    assert "ERROR toolchain tcutils_ort is unavailable: onnxruntime not installed" in result.stdout


def test_available_here():
    ok, reason = ort.available()
    assert ok and reason.startswith("onnxruntime ")


def test_pattern_table_claims_only_convertible_calls():
    table = {name: (pattern, check) for name, pattern, check in ort.pattern_table()}
    x = relay.var("x", shape=(1, 8, 8, 4))
    conv = relay.nn.conv2d(x, relay.const(np.ones((3, 3, 4, 4), "float32")), data_layout="NHWC", kernel_layout="HWIO")
    call = relay.transform.InferType()(tvm.IRModule.from_expr(conv))["main"].body
    pattern, check = table["tcutils_ort.nn.conv2d"]
    assert pattern.match(call) and not check(call)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], conv)))
    assert _compilers(ort.partition_for(mod)) == []


def test_codegen_rejects_functions_without_symbol():
    x = relay.var("x", shape=(2,))
    with pytest.raises(ValueError, match="global_symbol"):
        ort.compile_function(relay.Function([x], relay.tanh(x)))
    with pytest.raises(TypeError, match="relay.Function"):
        ort.compile_function(x)


def test_codegen_module_with_tuple_result_and_constants_runs_directly():
    x, y = relay.var("x", shape=(3, 4)), relay.var("y", shape=(4,))
    w = np.arange(16, dtype="float32").reshape(4, 4) / 16
    body = relay.Tuple([relay.nn.dense(x, relay.const(w)), relay.sigmoid(y)])
    func = relay.Function([x, y], body).with_attr("global_symbol", "tcutils_ort_tuple")
    module = ort.compile_function(func)
    xd = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
    yd = np.linspace(-2, 2, 4).astype("float32")
    outs = [tvm.nd.empty((3, 4), "float32"), tvm.nd.empty((4,), "float32")]
    module["tcutils_ort_tuple"](tvm.nd.array(xd), tvm.nd.array(yd), *outs)
    np.testing.assert_allclose(outs[0].numpy(), xd @ w.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), 1 / (1 + np.exp(-yd)), rtol=1e-6)


@pytest.mark.parametrize("partition", ["ort", "blas"])
def test_partition_constants_are_stored_once(partition, tmp_path):
    # ORT: the weight is lifted into TVM's parameters and left out of the payload; BLAS: it lives
    # in the embedded payload and TVM keeps no second copy. Either way the library holds it once.
    x = relay.var("x", shape=(4, 256))
    weight = np.random.default_rng(0).standard_normal((256, 256)).astype("float32")
    func = relay.Function([x], relay.nn.dense(x, relay.const(weight)))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    parted = (ort if partition == "ort" else blas).partition_for(mod)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(parted, target="llvm")
        exe = relay.vm.compile(parted, target="llvm")
    params = [p.numpy() for p in dict(lib.get_params()).values()]
    weight_bytes = 256 * 256 * 4
    if partition == "ort":
        assert len(params) == 1 and np.array_equal(params[0], weight)
    else:
        assert params == []
    # The VM keeps its constants in the bytecode, not the library: only an embedded payload is there.
    # An exported graph library holds its parameters twice whenever it has an external module (TVM
    # stores them with the graph and again for its constant loader): the lifted weight is one of them.
    limits = {"graph": (3 if partition == "ort" else 2) * weight_bytes,
              "vm": weight_bytes // 4 if partition == "ort" else 2 * weight_bytes}
    for name, module in (("graph", lib), ("vm", exe.save()[1])):
        path = str(tmp_path / f"{name}.so")
        module.export_library(path)
        assert os.path.getsize(path) < limits[name], name


def _dense_model(weight: np.ndarray, batch: int = 2) -> tvm.IRModule:
    x = relay.var("data", shape=(batch, weight.shape[1]))
    func = relay.Function([x], relay.nn.relu(relay.nn.dense(x, relay.const(weight))))
    return relay.transform.InferType()(tvm.IRModule.from_expr(func))


def _payload_sizes(parted: tvm.IRModule) -> list:
    return [len(ort.to_payload(f)) for gv, f in parted.functions.items() if gv.name_hint != "main"]


def test_large_weight_stays_out_of_the_payload_and_the_saved_module_reloads(tmp_path):
    from tvm_tcutils.models import load_model, save_model

    weight = np.random.default_rng(1).standard_normal((512, 1024)).astype("float32")  # 2 MiB
    mod = _dense_model(weight)
    parted = ort.partition_for(mod)
    assert max(_payload_sizes(parted)) < 4096
    data = np.random.default_rng(2).standard_normal((2, 1024)).astype("float32")
    first, vm = run_graph_and_vm(parted, {"data": data})
    for out in (first, vm):
        np.testing.assert_allclose(out, np.maximum(data @ weight.T, 0), rtol=1e-4, atol=1e-4)
    path = str(tmp_path / "parted.json")
    save_model(path, parted)
    loaded, params = load_model(path)
    assert tvm.ir.structural_equal(loaded, parted)
    ort.TOOLCHAIN.forget()  # as in a fresh process: the sessions are made from the loaded module's weight
    again = run_graph_and_vm(loaded, {"data": data}, params)
    np.testing.assert_array_equal(again[0], first)
    np.testing.assert_array_equal(again[1], vm)


def test_partitions_equal_but_for_their_weights_get_their_own_sessions():
    rng = np.random.default_rng(4)
    weights = [rng.standard_normal((128, 256)).astype("float32") for _ in range(2)]
    data = rng.standard_normal((2, 256)).astype("float32")
    parted = [ort.partition_for(_dense_model(w)) for w in weights]
    # The same graph, the same payload: only the digest of the lifted weight tells them apart.
    assert len({ort.to_payload(p["tvmgen_default_tcutils_ort_main_0"]) for p in parted}) == 1
    for weight, mod in zip(weights, parted):
        for out in run_graph_and_vm(mod, {"data": data}):
            np.testing.assert_allclose(out, np.maximum(data @ weight.T, 0), rtol=1e-4, atol=1e-4)


def test_lifting_leaves_small_constants_and_other_compilers_alone():
    small = _dense_model(np.ones((8, 16), "float32"))
    parted = ort.partition_for(small)
    assert [p.name_hint for p in parted["tvmgen_default_tcutils_ort_main_0"].params] == ["tcutils_ort_0_i0"]
    big = blas.partition_for(_dense_model(np.ones((128, 256), "float32")))
    assert not any(p.name_hint.startswith("tcutils_lifted_") for f in big.functions.values() for p in f.params)


_THREADS = """
import tvm_tcutils
from tvm_tcutils.collage.toolchains import ort, PACKAGE_TOOLCHAINS
print(ort.ort_threads(), ort._session_options().intra_op_num_threads, PACKAGE_TOOLCHAINS["ort"].cache_tag())
"""


@pytest.mark.parametrize("env,threads", [
    ({"TVM_NUM_THREADS": "1"}, 1),
    ({"TVM_NUM_THREADS": "2"}, 2),
    ({"TVM_NUM_THREADS": "2", "TVM_TCUTILS_ORT_THREADS": "1"}, 1),
])
def test_ort_threads_follow_tvm_pool_unless_set(env, threads):
    # One thread budget for both toolchains: TVM's default pool can be smaller than onnxruntime's.
    clean = {"TVM_TCUTILS_ORT_THREADS": ""} | env
    # Forked from the fork server, whose TVM never started its pool: the child's pool is sized from its own
    # environment, as a fresh interpreter's is.
    proc = run_python(_THREADS, env=clean, fresh=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found, option, tag = proc.stdout.split()
    assert int(found) == int(option) == threads
    assert f"threads={env['TVM_NUM_THREADS']}" in tag
    assert ("TVM_TCUTILS_ORT_THREADS" in tag) == ("TVM_TCUTILS_ORT_THREADS" in env)


def test_bad_ort_threads_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TVM_TCUTILS_ORT_THREADS", "two")
    with pytest.raises(ValueError, match="TVM_TCUTILS_ORT_THREADS must be a positive integer"):
        ort.ort_threads()


def test_models_computing_much_run_without_the_memory_arena(monkeypatch):
    from tvm_tcutils.collage.toolchains.packed_call import activation_bytes
    from tvm_tcutils.measure import build, graph_module, outputs

    mod = small_conv_net()
    var = mod["main"].params[0]
    inputs = {var.name_hint: np.random.default_rng(2).standard_normal([int(d) for d in var.checked_type.shape])
              .astype("float32")}
    parted = ort.partition_for(mod)
    [func] = [f for gv, f in parted.functions.items() if gv.name_hint != "main"]
    computed = int(ort._metadata(ort.to_payload(func))[ort.ACTIVATION_KEY])
    assert computed == activation_bytes(func) > 0
    expected = _reference(mod, inputs)
    lib = build(parted, None, "llvm")
    for limit, arena in [(computed + 1, True), (computed, False)]:
        monkeypatch.setattr(ort, "NO_ARENA_BYTES", limit)
        ort.TOOLCHAIN.forget()  # the session is made again, with this limit, on the next run
        try:
            runner = graph_module(lib, inputs)
            runner.run()
            options = [s.session.get_session_options() for s in ort.TOOLCHAIN._states.values()]
        finally:
            ort.TOOLCHAIN.forget()
        assert options and all(o.enable_cpu_mem_arena == arena and o.enable_mem_pattern == arena for o in options)
        np.testing.assert_allclose(outputs(runner)[0], expected, rtol=1e-4, atol=1e-4)
