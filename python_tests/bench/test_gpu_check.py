"""The GPU check (``tvm_tcutils.bench.gpu_check``) on a machine without a GPU: its rehearsal.

Everything before the first kernel launch must run here, so that a short GPU lease is not spent on a
mistake a CPU machine could have shown: the builds for the GPU's architecture, the CPU reference, the
JSON. Needs the package's CUDA plugin (or a CUDA build of TVM); skips with the reason otherwise.
"""
import json
import sys

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

import tvm_tcutils
from tvm_tcutils import cuda
from tvm_tcutils.bench import gpu_check
from tvm_tcutils.bench.results import Results

pytestmark = pytest.mark.skipif(not cuda.status()["codegen"], reason=f"no CUDA code generation: {cuda.status()['reason']}")


@pytest.fixture
def results():
    return Results("gpu_check_test", [])


def _no_gpu():
    if gpu_check.gpu_present():
        pytest.skip("this machine has a GPU: the rehearsal is for machines without one")


@pytest.mark.parametrize("shape, arch, kernels", [
    ((32, 64, 32), "sm_80", ["tcutils"]),  # no mma tiling fits K = 32 (two stages of at least 32 bytes)
    ((8, 32, 64), "sm_80", ["tcutils"]),
    ((128, 256, 512), "sm_75", ["tcutils"]),  # no int8 m16n8k32 before sm_80
])
def test_dense_rehearsal_builds_each_kernel_and_times_nothing(results, shape, arch, kernels):
    _no_gpu()
    gpu_check.dense(results, arch, shapes=[shape])
    (row,) = results.rows
    assert row["rehearsal"] and (row["m"], row["n"], row["k"]) == shape and row["kernels"] == kernels
    assert not any(key in row for key in ("tcutils", "cublaslt", "mma"))
    # The mma kernel's rehearsal is in python_tests/tensorcore/test_mma_gemm.py (one process parses TVM's CUDA
    # tensor intrinsics, seconds).


def test_int4_cast_rehearsal_builds_the_round_trip(results):
    _no_gpu()
    gpu_check.int4_cast(results, "sm_90")
    assert [row["shape"] for row in results.rows] == [[8, 8, 8, 64], [1, 3]]
    assert all(row["rehearsal"] for row in results.rows)


def test_tune_rehearsal_builds_finds_the_task_and_a_runner_that_has_cuda(results, tmp_path):
    _no_gpu()
    gpu_check.tune(results, "sm_90", "dense", log_dir=str(tmp_path))
    (row,) = results.rows
    assert row["rehearsal"] and row["tasks"] == 1 and row["template"] == "tcutils.dense_tensorcore.cuda"
    # The local runner's RPC server must have the plugin's cuda device API, or no CUDA trial could run.
    assert row["server_has_cuda"] is cuda.status()["plugin"]
    assert not any(key in row for key in ("tuned", "untuned"))
    with pytest.raises(ValueError, match="model must be one of resnet50, resnet50_mma, dense, dense_mma"):
        gpu_check.tune(results, "sm_90", "resnet")





def test_without_softmax_returns_the_logits_and_leaves_the_input_alone():
    mod, _ = tvm_tcutils.load_model("resnet-18")
    before = tvm.ir.save_json(mod)
    logits = gpu_check._without_softmax(mod)
    assert mod["main"].body.op.name == "nn.softmax" and logits["main"].body.op.name != "nn.softmax"
    assert tvm.ir.save_json(mod) == before
    x = relay.var("x", shape=(2, 3))
    plain = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x)))
    assert tvm.ir.structural_equal(gpu_check._without_softmax(plain)["main"], plain["main"])


@pytest.mark.parametrize("name,dtype,peak", [("NVIDIA H200", "int8", 1979.0), ("NVIDIA A100-SXM4-80GB", "int4", 1248.0),
                                             ("NVIDIA H100 PCIe", "int8", 1513.0), ("NVIDIA H200", "int4", None)])
def test_peak_table(name, dtype, peak):
    assert gpu_check.peak_tops(name, dtype) == peak


def test_markdown_tables_come_from_the_json(results, tmp_path):
    timing = {"median_ms": 2.0, "min_ms": 2.0, "spread": 0.0, "samples_ms": [2.0]}
    ratio = {"value": 0.5, "low": 0.4, "high": 0.6, "confidence": 0.95}
    results.add(part="dense", m=128, n=256, k=512, peak_tops=100.0, tcutils=timing, cublaslt=timing,
                tcutils_tops=0.03, cublaslt_tops=0.03, cublaslt_over_tcutils=ratio, exact=True)
    results.add(part="dense", m=256, n=256, k=512, peak_tops=100.0, tcutils=timing, cublaslt=timing, mma=timing,
                tcutils_tops=0.07, cublaslt_tops=0.07, mma_tops=0.07, cublaslt_over_tcutils=ratio,
                cublaslt_over_mma=ratio, exact=True, mma_exact=False)
    results.add(part="dense", m=512, n=256, k=512, peak_tops=100.0, tcutils=timing, cublaslt=timing, wgmma=timing,
                tcutils_tops=0.13, cublaslt_tops=0.13, wgmma_tops=0.13, cublaslt_over_tcutils=ratio,
                cublaslt_over_wgmma=ratio, exact=True, wgmma_exact=True)
    results.add(part="tune", model="dense", template="t.cuda", tasks=1, tasks_tuned=1, new_trials=16, tune_s=50.0,
                untuned=timing, tuned=timing, untuned_over_tuned=ratio, max_abs_diff=0.0)
    results.add(part="resnet50", batch=8, tcutils=timing, tcutils_mma=timing, torch_fp16=timing,
                torch_fp16_over_tcutils_best=ratio, tvm_error="no GPU", max_abs_diff=0.0, max_abs_ref=9.0,
                mma_vs_tcutils_max_abs_diff=0.0, top1_agree=1.0)
    path = results.write(str(tmp_path / "g.json"))
    table = gpu_check.markdown(json.load(open(path)))
    assert ("| 128 x 256 x 512 | 2.000 (0) | - | - | 2.000 (0) | x0.50 [0.40, 0.60] | - | - | 100 | 0.0 / - / - "
            "| yes / - / - |") in table
    assert ("| 256 x 256 x 512 | 2.000 (0) | 2.000 (0) | - | 2.000 (0) | x0.50 [0.40, 0.60] | x0.50 [0.40, 0.60] | - "
            "| 100 | 0.1 / 0.1 / - | yes / NO / - |") in table
    assert ("| 512 x 256 x 512 | 2.000 (0) | - | 2.000 (0) | 2.000 (0) | x0.50 [0.40, 0.60] | - | x0.50 [0.40, 0.60] "
            "| 100 | 0.1 / - / 0.1 | yes / - / yes |") in table
    assert ("| ResNet-50 int8, batch 8 | 2.000 | 2.000 | no GPU | - | 2.000 | x0.50 [0.40, 0.60] | 0 (of 9) | 0 "
            "| 1.00 |") in table
    assert "| int8 dense 4096 x 4096 x 4096 (`t.cuda`) | 1 of 1 | 16 (50) | 2.000 | 2.000 | x0.50 [0.40, 0.60] | 0 |" \
        in table


def test_summary_is_a_geometric_mean():
    class R:
        def __init__(self, value):
            self.value = value

    rows = [{"part": "layers", "tvm_over_tcutils": R(v)} for v in (0.5, 2.0, 4.0)]
    assert np.isclose(gpu_check.summary(rows)["layers_geomean_tvm_over_tcutils"], 4 ** (1 / 3))  # (0.5*2*4)^(1/3)


def test_saturating_casts_clip_each_narrow_cast_to_its_range_and_leave_the_input_alone():
    x = relay.var("x", shape=(6,), dtype="float32")
    body = relay.Tuple([relay.cast(x, "int8"), relay.cast(x, "uint8"), relay.cast(x, "float16"),
                        relay.cast(relay.cast(x, "int32"), "int4")])
    mod = tvm.IRModule.from_expr(relay.Function([x], body))
    before = tvm.ir.save_json(mod)
    clipped = gpu_check._saturating_casts(mod)
    assert tvm.ir.save_json(mod) == before
    ranges = {}

    def visit(node):
        if isinstance(node, relay.Call) and node.op.name == "cast" and isinstance(node.args[0], relay.Call) \
                and node.args[0].op.name == "clip":
            ranges[str(node.attrs.dtype)] = (node.args[0].attrs.a_min, node.args[0].attrs.a_max)

    relay.analysis.post_order_visit(clipped["main"], visit)
    assert ranges == {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7)}
    # int8 and uint8 run on the CPU: values past the range saturate instead of being undefined.
    value = np.array([-1000.0, -128.5, -3.7, 0.0, 254.9, 1e6], dtype="float32")
    two = relay.Function([x], relay.Tuple([relay.cast(x, "int8"), relay.cast(x, "uint8")]))
    lib = relay.build(gpu_check._saturating_casts(tvm.IRModule.from_expr(two)), target="llvm")
    module = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    module.set_input("x", value)
    module.run()
    assert module.get_output(0).numpy().tolist() == [-128, -128, -3, 0, 127, 127]
    assert module.get_output(1).numpy().tolist() == [0, 0, 0, 0, 254, 255]


@pytest.mark.slow  # seconds of onnxruntime quantization and a CUDA build
def test_bert_rehearsal_puts_the_encoders_products_on_tensor_cores(results, tmp_path):
    _no_gpu()
    gpu_check.bert(results, "sm_90", config={"layers": 1, "seq": 64, "hidden": 64, "heads": 1},
                   work_dir=str(tmp_path))
    (row,) = results.rows
    counts = dict(map(tuple, row["tensor_core_kernels"]))
    assert row["rehearsal"] and counts.get("IMMA.16832.U8.U8") == 2 and sum(counts.values()) >= 8, counts
    from tvm_tcutils.tensorcore import strategy

    assert not strategy.MMA_VERIFIED_ARCHS and not strategy.WGMMA_VERIFIED_ARCHS  # the part's gates undone


def test_bert_table_comes_from_the_json(results, tmp_path):
    timing = {"median_ms": 2.0, "min_ms": 2.0, "spread": 0.0, "samples_ms": [2.0]}
    ratio = {"value": 1.5, "low": 1.4, "high": 1.6, "confidence": 0.95}
    results.add(part="bert", layers=12, seq=128, hidden=768, heads=12, tensor_core_kernels=[["IMMA.16832.U8.U8", 24]],
                tcutils=timing, torch_fp16=timing, torch_fp16_over_tcutils=ratio, max_abs_diff=0.01, max_abs_ort=2.0)
    table = gpu_check.markdown(json.load(open(results.write(str(tmp_path / "b.json")))))
    assert ("| 12 x 768, 12 heads, seq 128 | IMMA.16832.U8.U8 x24 | 2.000 | 2.000 | x1.50 [1.40, 1.60] | 0.01 (2) |"
            in table)


#: A stand-in for PyTorch (the GPU machine has it, this one need not): every layer passes its input on, a
#: timed run of ``number`` calls lasts 12 ms, and a batch of 0 fails as a real model would on bad input.
_FAKE_TORCH = '''
import contextlib, types

class _Layer:
    def __init__(self, *args, **kwargs):
        self.layers = [a for a in args if isinstance(a, _Layer)]
    def __call__(self, x):
        forward = getattr(type(self), "forward", None)
        if forward is not None:
            return forward(self, x)
        for layer in self.layers:
            x = layer(x)
        return x
    def eval(self):
        return self
    half = cuda = eval
    def to(self, *args, **kwargs):
        return self
    def __add__(self, other):
        return self

def randn(*shape, **kwargs):
    if 0 in shape:
        raise ValueError("cannot make an empty batch")
    return _Layer()

class Event:
    def __init__(self, enable_timing=False):
        pass
    def record(self):
        pass
    def elapsed_time(self, end):
        return 12.0

nn = types.SimpleNamespace(Module=_Layer, **{name: _Layer for name in (
    "Sequential Conv2d BatchNorm2d ReLU MaxPool2d AdaptiveAvgPool2d Flatten Linear TransformerEncoderLayer "
    "TransformerEncoder").split()})
cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)
backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=False))
inference_mode = contextlib.nullcontext
manual_seed = lambda seed: None
channels_last = float16 = None
'''


@pytest.mark.parametrize("script, request_, error_request", [
    (gpu_check._TORCH_RESNET_WORKER, (8, 20), (0, 20)),
    (gpu_check._TORCH_BERT_WORKER, (2, 128, 64, 2, 20), (2, 0, 64, 2, 20)),
], ids=["resnet50", "bert"])
def test_torch_workers_answer_each_request_and_name_failures(tmp_path, monkeypatch, script, request_, error_request):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(_FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    worker = gpu_check.TorchWorker(sys.executable, script)
    try:
        assert worker.request(*request_) == pytest.approx(12.0 / 20)
        assert worker.request(*request_) == pytest.approx(12.0 / 20)
        with pytest.raises(RuntimeError, match="cannot make an empty batch"):
            worker.request(*error_request)
    finally:
        worker.close()
    assert worker.proc.returncode == 0
