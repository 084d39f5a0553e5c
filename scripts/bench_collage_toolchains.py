#!/usr/bin/env python
"""Per-operator-kind latency of the Collage toolchains: ORT vs TVM vs BLAS, in one run.

Each kind is one small Relay function at the shapes of the issue's models
(BERT-like encoder: 128 tokens, hidden 256, 4 heads; ResNet-50's 3x3 conv),
with He-style weights and normal inputs. It is built three ways and timed
side by side in this process:

* ``tvm``: TVM alone (``relay.build``, opt_level 3, llvm for this CPU);
* ``fastmath``: the same after TVM's ``FastMath`` rewrite (the Collage
  toolchain ``tvm-fastmath``: fast erf, exp, tanh, softmax);
* ``ort``: the whole function partitioned to ``tcutils_ort`` (ONNX through the
  package's packed-function call, as Collage would run it);
* ``blas``: the matrix products partitioned to ``tcutils_blas`` (numpy's
  OpenBLAS), for the kinds that have one;
* ``ort-direct``: the same ONNX model run by onnxruntime from Python with an
  IOBinding, to show what the packed-function hop costs.

Variants are timed round-robin (5 runs each per round after a warm-up and a
20 ms pause, median over rounds)
so that changes in machine load hit all of them alike. Ratios are
toolchain / tvm (below 1 = faster than TVM).

With ``--models``, whole models instead: TVM alone, the greedy BYOC
partition to ``tcutils_ort`` (every convertible region), and onnxruntime on
the original ONNX graph for the ONNX-built models (outputs are checked
against TVM alone).

Usage::

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_collage_toolchains.py [--repeat 30] [--kinds dense,softmax]
    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_collage_toolchains.py --models bert-tiny-onnx,resnet-18
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib import graph_executor  # noqa: E402

import tvm_tcutils  # noqa: E402,F401  (registers the toolchains)
from tvm_tcutils import models  # noqa: E402
from tvm_tcutils.collage.toolchains import TVM_FASTMATH, blas, ort, relay_to_onnx  # noqa: E402

RNG = np.random.default_rng(0)
SEQ, HIDDEN, HEADS = 128, 256, 4


def _weight(*shape):
    return relay.const((RNG.standard_normal(shape) * np.sqrt(2.0 / shape[-1])).astype("float32"))


def _dense(units, k):
    x = relay.var("x", shape=(SEQ, k))
    return [x], relay.nn.bias_add(relay.nn.dense(x, _weight(units, k)), _weight(units))


def _batch_matmul():
    q = relay.var("q", shape=(HEADS, SEQ, HIDDEN // HEADS))
    k = relay.var("k", shape=(HEADS, SEQ, HIDDEN // HEADS))
    return [q, k], relay.nn.batch_matmul(q, k)


def _softmax():
    x = relay.var("x", shape=(1, HEADS, SEQ, SEQ))
    return [x], relay.nn.softmax(x)


def _gelu():
    x = relay.var("x", shape=(SEQ, 4 * HIDDEN))
    erf = relay.erf(relay.divide(x, relay.const(np.sqrt(2.0), "float32")))
    return [x], relay.multiply(relay.multiply(x, relay.add(erf, relay.const(1.0))), relay.const(0.5))


def _layer_norm():
    # As TVM's ONNX importer writes LayerNormalization: mean, variance, sqrt, divide.
    x = relay.var("x", shape=(SEQ, HIDDEN))
    mean = relay.mean(x, axis=-1, keepdims=True)
    var = relay.variance(x, axis=-1, keepdims=True, with_mean=mean)
    norm = relay.divide(relay.subtract(x, mean), relay.sqrt(relay.add(var, relay.const(1e-12))))
    return [x], relay.add(relay.multiply(norm, _weight(HIDDEN)), _weight(HIDDEN))


def _conv():
    x = relay.var("x", shape=(1, 64, 56, 56))
    y = relay.nn.conv2d(x, _weight(64, 64, 3, 3), padding=(1, 1), channels=64, kernel_size=(3, 3))
    return [x], relay.nn.relu(relay.nn.bias_add(y, _weight(64)))


KINDS = {
    "dense": lambda: _dense(4 * HIDDEN, HIDDEN),
    "dense_out": lambda: _dense(HIDDEN, 4 * HIDDEN),
    "batch_matmul": _batch_matmul,
    "softmax": _softmax,
    "gelu_erf": _gelu,
    "layernorm": _layer_norm,
    "conv": _conv,
}
HAS_BLAS = {"dense", "dense_out", "batch_matmul"}


def _graph_timer(mod, inputs, params=None):
    """Build ``mod``; return (a function timing 5 runs in ms, the output)."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm_tcutils.host_target(), params=params)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**inputs)
    runner.run()
    timer = runner.module.time_evaluator("run", tvm.cpu(), number=5, repeat=1)
    return lambda: float(timer().mean * 1e3), runner.get_output(0).numpy()


def _ort_direct_timer(func, inputs, model=None):
    """onnxruntime on the same ONNX model (or ``model``) from Python, with an IOBinding."""
    import onnxruntime

    if model is None:
        model = relay_to_onnx.to_onnx(relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"])
    options = onnxruntime.SessionOptions()
    # As the toolchain's sessions: idle threads sleep instead of spinning into the next variant's time.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    for arg, value in zip(session.get_inputs(), inputs.values()):
        binding.bind_cpu_input(arg.name, value)
    binding.bind_output(session.get_outputs()[0].name, "cpu")
    session.run_with_iobinding(binding)

    def timer():
        start = time.perf_counter()
        for _ in range(5):
            session.run_with_iobinding(binding)
        return (time.perf_counter() - start) / 5 * 1e3

    return timer


def _interleaved_medians(timers, repeat):
    """Median ms of each timer, timed round-robin so that load changes hit all alike.

    A short pause before each sample lets the previous variant's worker
    threads (TVM's pool, OpenBLAS) stop spinning, so no variant pays for another.
    """
    samples = {name: [] for name in timers}
    for _ in range(repeat):
        for name, timer in timers.items():
            time.sleep(0.02)
            timer()  # warm: wake this variant's threads
            samples[name].append(timer())
    return {name: float(np.median(values)) for name, values in samples.items()}


def _bench_models(names, repeat) -> None:
    print(f"{'model':<20}{'tvm ms':>9}{'ort-byoc':>10}{'onnx-ort':>10}{'byoc/tvm':>10}{'onnx/tvm':>10}  partitions")
    for name in names:
        mod, params = models.load_model(name)
        inputs = models.random_inputs(mod, params)
        timers = {}
        timers["tvm"], expected = _graph_timer(mod, inputs, params)
        parted = ort.partition_for(mod, params)
        count = sum(1 for _, f in parted.functions.items() if f.attrs is not None and "Compiler" in f.attrs)
        timers["byoc"], got = _graph_timer(parted, inputs)
        np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)
        if name in models.ONNX_BUILDERS:
            timers["onnx"] = _ort_direct_timer(None, inputs, models.onnx_model(name))
        ms = _interleaved_medians(timers, repeat)
        onnx_ms = ms.get("onnx")
        onnx_cells = (f"{onnx_ms:>10.2f}{onnx_ms / ms['tvm']:>10.2f}" if onnx_ms else f"{'-':>10}" * 2)
        print(f"{name:<20}{ms['tvm']:>9.2f}{ms['byoc']:>10.2f}{onnx_cells[:10]}{ms['byoc'] / ms['tvm']:>10.2f}"
              f"{onnx_cells[10:]}  {count}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="rounds; each times 5 runs of every variant")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {list(KINDS)}")
    parser.add_argument("--models", default="", help="comma-separated model names: benchmark whole models instead")
    args = parser.parse_args(argv)
    if args.models:
        print(f"tvm {tvm.__version__}, {ort.available()[1]}, TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}")
        _bench_models([m for m in args.models.split(",") if m], args.repeat)
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    ok, reason = ort.available()
    print(f"tvm {tvm.__version__}, {reason}, {blas.available()[1]}, "
          f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}, target={tvm_tcutils.host_target()}")
    header = (f"{'kind':<13}{'tvm ms':>9}{'fastmath':>9}{'ort ms':>9}{'blas ms':>9}{'ort-direct':>11}"
              f"{'ort/tvm':>9}{'blas/tvm':>9}")
    print(header)
    print("-" * len(header))
    for kind in kinds:
        params, body = KINDS[kind]()
        func = relay.Function(params, body)
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
        inputs = {p.name_hint: RNG.standard_normal([int(d) for d in p.type_annotation.shape]).astype("float32")
                  for p in params}
        timers = {}
        timers["tvm"], expected = _graph_timer(mod, inputs)
        timers["fastmath"], got = _graph_timer(TVM_FASTMATH.rewrite(mod), inputs)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        variants = []
        if ok:
            variants.append(("ort", ort.partition_for(mod)))
        if kind in HAS_BLAS:
            variants.append(("blas", blas.partition_for(mod)))
        for name, parted in variants:
            timers[name], got = _graph_timer(parted, inputs)
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
        if ok:
            timers["direct"] = _ort_direct_timer(func, inputs)
        cells = {"ort": None, "blas": None, "direct": None}
        cells.update(_interleaved_medians(timers, args.repeat))
        tvm_ms = cells["tvm"]

        def fmt(value, width, ratio=False):
            if value is None:
                return f"{'-':>{width}}"
            return f"{value / tvm_ms:>{width}.2f}" if ratio else f"{value:>{width}.3f}"

        print(f"{kind:<13}{tvm_ms:>9.3f}{fmt(cells['fastmath'], 9)}{fmt(cells['ort'], 9)}{fmt(cells['blas'], 9)}"
              f"{fmt(cells['direct'], 11)}"
              f"{fmt(cells['ort'], 9, True)}{fmt(cells['blas'], 9, True)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
