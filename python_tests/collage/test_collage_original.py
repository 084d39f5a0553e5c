"""Baselines as users run them: each ONNX runtime on the user's own file in the final comparison, and the
report naming the operators that kept a runtime from a region."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tvm_tcutils.collage import MockCostEstimator, partition  # noqa: E402
from tvm_tcutils.collage.driver import ON_THE_FILE, file_twins, original_modules, prepare  # noqa: E402
from tvm_tcutils.collage.report import answer_line, report_lines  # noqa: E402
from tvm_tcutils.collage.toolchains import relay_to_onnx, resolve  # noqa: E402
from tvm_tcutils.collage.toolchains.ort import FILE_ATTR  # noqa: E402
from tvm_tcutils.models import load_model  # noqa: E402

from conftest import build_and_run  # noqa: E402
from test_collage_final import Sampling  # noqa: E402

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

INPUT = np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype("float32")


def _onnx_file(tmp_path, with_lrn: bool = False) -> str:
    """A small CNN block written as an ONNX file (by the package's exporter), as a user would bring it."""
    x = relay.var("x", shape=INPUT.shape)
    w = relay.const(np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype("float32") * 0.1)
    y = relay.nn.relu(relay.nn.conv2d(x, w, padding=(1, 1), channels=8, kernel_size=(3, 3)))
    if with_lrn:
        y = relay.nn.lrn(y, size=3, axis=1)
    y = relay.tanh(relay.nn.max_pool2d(y, pool_size=(2, 2), strides=(2, 2)))
    func = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))["main"]
    model = relay_to_onnx.to_onnx(func)
    model.graph.input[0].name = "image"  # a name of the user's, kept by TVM's importer
    for node in model.graph.node:
        node.input[:] = ["image" if name == "in0" else name for name in node.input]
    path = str(tmp_path / "user_model.onnx")
    with open(path, "wb") as fh:
        fh.write(model.SerializeToString())
    return path


def _ort_on(path: str) -> np.ndarray:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": INPUT})[0]


class FileFastest(MockCostEstimator):
    """Mock candidate costs; whole models timed as 2 ms, the runtime on the user's file as 0.5 ms."""

    def whole_model_timer(self):
        return Sampling(self)

    def measure_whole(self, mod):
        on_file = any(func.attrs is not None and FILE_ATTR in func.attrs for func in mod.functions.values())
        return 0.5 if on_file else 2.0


def test_the_runtime_on_the_users_file_competes_and_its_module_is_what_was_timed(tmp_path):
    path = _onnx_file(tmp_path)
    mod, params = load_model(path)
    result = partition(mod, params, ["tvm", "ort"], FileFastest({"tvm": 1.0, "ort": 2.0}), original=path)
    name = f"ort{ON_THE_FILE}"
    assert set(result.final.timings) == {"tvm alone", name}
    assert result.answer == name and answer_line(result).startswith(f"answer: {name}")
    # onnxruntime alone takes every operator: the same runtime as on the file, so only the file is timed.
    assert result.unreachable == {} and result.left_out == {"ort alone": f"the same runtime on every operator as {name}"}
    assert any(ln.split() == ["ort", "alone", "not", "timed:", "the", "same", "runtime", "on", "every", "operator",
                              "as", "ort", "on", "the", "file"] for ln in report_lines(result))
    # One partition: onnxruntime on the file itself, by its absolute path, in the file's input order.
    external = [f for gv, f in result.mod.functions.items() if gv.name_hint != "main"]
    assert len(external) == 1 and str(external[0].attrs[FILE_ATTR]) == os.path.abspath(path)
    assert [p.toolchain for p in result.partitions if p.function] == ["ort"]
    # Built later, it runs the file: the outputs are onnxruntime's on the file.
    got = build_and_run(result.mod, inputs={"image": INPUT})[0]
    np.testing.assert_allclose(got, _ort_on(path), rtol=1e-6, atol=1e-6)


def test_a_toolchain_alone_stays_beside_the_file_where_tvm_runs_part_of_it():
    chains = resolve("tvm,ort,openvino")
    on_file = [f"ort{ON_THE_FILE}", f"openvino{ON_THE_FILE}"]
    assert file_twins(chains, on_file, {}) == {"ort alone": on_file[0], "openvino alone": on_file[1]}
    # An operator onnxruntime's export lacks (TVM runs it): onnxruntime alone is another partitioning than
    # the runtime on the file, and both are timed.
    assert file_twins(chains, on_file, {"ort": {"take": 1}}) == {"openvino alone": on_file[1]}
    assert file_twins(chains, on_file[1:], {}) == {"openvino alone": on_file[1]}  # no file for ort: no twin
    assert file_twins(chains, [], {}) == {}


def test_a_module_of_a_file_that_changed_since_it_was_timed_does_not_build(tmp_path):
    path = _onnx_file(tmp_path)
    mod, params = load_model(path)
    modules = original_modules(prepare(mod, params), path, resolve("tvm,ort"))
    assert list(modules) == [f"ort{ON_THE_FILE}"]
    with open(path, "ab") as fh:  # a byte more: another file
        fh.write(b"\0")
    with pytest.raises(Exception, match="changed since Collage timed it"):
        build_and_run(modules[f"ort{ON_THE_FILE}"], inputs={"image": INPUT})


def test_a_file_whose_inputs_are_not_the_models_is_not_timed(tmp_path, caplog):
    path = _onnx_file(tmp_path)
    mod, params = load_model("mlp")  # one input too, of another shape: another model than the file's
    assert original_modules(prepare(mod, params), path, resolve("tvm,ort")) == {}
    assert "not timed on the file" in caplog.text


@pytest.mark.parametrize("content, error, message", [
    (None, FileNotFoundError, "original: no such file"),
    (b"not a model", ValueError, "original: .* is not an ONNX model"),
])
def test_a_bad_original_file_is_refused_before_the_search(tmp_path, content, error, message):
    path = str(tmp_path / "model.onnx")
    if content is not None:
        with open(path, "wb") as fh:
            fh.write(content)
    mod, params = load_model("mlp")
    with pytest.raises(error, match=message):
        partition(mod, params, ["tvm", "ort"], MockCostEstimator({"tvm": 1.0}), original=path)


def test_the_report_names_the_operators_a_runtime_cannot_take(tmp_path):
    x = relay.var("x", shape=(1, 8, 4, 4))
    y = relay.nn.relu(relay.take(relay.exp(x), relay.const(np.array([0, 2], "int32")), axis=1))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    result = partition(mod, None, ["tvm", "ort"], MockCostEstimator({"tvm": 1.0, "ort": 0.5}), progress=False)
    assert result.unreachable == {"ort": {"take": 1}}
    assert "operators ort cannot take (TVM runs them): take x1" in report_lines(result)
    # With the exporter's LRN an Inception-style LRN is reachable: nothing to name.
    lrn = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.nn.lrn(relay.exp(x)))))
    assert partition(lrn, None, ["tvm", "ort"], MockCostEstimator({"tvm": 1.0, "ort": 0.5}),
                     progress=False).unreachable == {}


def test_every_contender_and_the_file_is_timed_in_a_process_of_its_own(tmp_path, monkeypatch):
    import gc

    from tvm_tcutils.collage.cost import workers
    from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator
    from tvm_tcutils.collage.toolchains.packed_call import LIFT_MIN_BYTES

    isolated = []  # (pid, pool): not the modules themselves, whose collection stops their workers

    class Recorded(workers.IsolatedModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            isolated.append((self.pid, self.pool))

    monkeypatch.setattr(workers, "IsolatedModule", Recorded)

    # A weight large enough to be lifted out of a candidate's payload: the file's runtime takes none.
    x = relay.var("x", shape=(1, 256))
    w = relay.const(np.random.default_rng(1).standard_normal((LIFT_MIN_BYTES // 1024, 256)).astype("float32"))
    func = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.tanh(relay.nn.dense(x, w)))))
    path = str(tmp_path / "dense.onnx")
    with open(path, "wb") as fh:
        fh.write(relay_to_onnx.to_onnx(func["main"]).SerializeToString())
    mod, params = load_model(path)
    # One measuring worker (the candidates' pool is not what is checked: the comparison's own workers are).
    est = MeasuredCostEstimator(cache_dir=str(tmp_path / "costs"), repeat=2, progress=False, workers=1)
    try:
        # A 1 s comparison budget: the budget is checked between rounds and at least one round runs, so every
        # contender is still timed in its own worker (what is checked below); this tiny model's near-ties
        # would otherwise spend the whole budget on more rounds of the same workers.
        result = partition(mod, params, ["tvm", "ort"], est, original=path, compare_budget_s=1.0)
    finally:
        est.close()
    name = f"ort{ON_THE_FILE}"
    assert result.final.timings[name].samples_ms, result.final.reason
    assert all(t.samples_ms for t in result.final.timings.values()), result.final.timings
    # One worker of its own per contender (validation's mix timed in one more, which the comparison takes
    # where the mix is one of its contenders), none of them this process; each gone with the comparison.
    pids = {pid for pid, _ in isolated}
    assert len(result.final.timings) <= len(isolated) <= len(result.final.timings) + 1
    assert len(pids) == len(isolated) and os.getpid() not in pids
    gc.collect()
    assert all(not pool._workers for _, pool in isolated)
