"""The int8 dot-product benchmark's contenders: peaks, ResNet-50 layers, our kernels, onnxruntime, fp32.

Used by ``scripts/bench_int8.py`` (its docstring describes the columns). Every
contender is a timer in ms (:mod:`tvm_tcutils.bench.competitors`), timed in
turns by :func:`gops`; :data:`TARGET` is this CPU's unless the script sets it.

Examples
--------
>>> resnet50_layers()[0]
(64, 56, 56, 64, 1, 1, 0)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from .._tvm import host_target, tvm
from tvm import autotvm, relay, te, tir

from ..dotprod.cpu_facts import chain_arguments, chain_gop, chain_gops, chain_kernel
from ..dotprod.isa import for_target, range_isa, tile_isa
from ..dotprod.strategy import CONV2D_NCHWC_TASK, DENSE_AMX_TASK, DENSE_PACK_TASK
from ..dotprod.topi import packing
from ..files import atomic_path, cache_dir
from ..measure import graph_module, time_function
from ..models import load_model, onnx_graph_inputs
from ..processes import unpin
from ..tuning import PackageLocalRunner
from .competitors import (
    SampleTimer, compare, onnx_session, openvino_file, ort_session, relay_module, te_function, timed_once,
)
from .models import conv_layers

TARGET = host_target()  # code for another CPU may not run here (SIGILL); the script's --target sets it
RNG = np.random.default_rng(0)


def gops(timers: Mapping[str, Optional[SampleTimer]], gop: float, rounds: int,
         gop_of: Optional[Mapping[str, float]] = None) -> Dict[str, float]:
    """GOPS of each contender (``gop`` billion operations per run, or ``gop_of[name]`` for the contenders it
    names), timed in turns; ``nan`` for a missing one.

    Examples
    --------
    >>> gops({"a": lambda: 2.0, "b": None, "c": lambda: 1.0}, 1e-3, 2, gop_of={"c": 4e-3})
    {'a': 0.5, 'b': nan, 'c': 4.0}
    """
    gop_of = gop_of or {}
    timed = compare(timers, rounds)
    return {name: gop_of.get(name, gop) / (t.median_ms / 1e3) if t.samples_ms else float("nan")
            for name, t in timed.items()}


def set_threads(n: int) -> None:
    """TVM's pool to ``n`` threads, its workers pinned as TVM pins them, the main thread free.

    ``runtime.config_threadpool`` cannot grow the pool beyond ``TVM_NUM_THREADS`` (which
    :func:`main` sets) and may pin the calling thread to one core; threads created later (
    onnxruntime's intra-op pool) inherit that mask, and ran their 2 threads on one core. So the
    main thread gets every CPU it was given back (:func:`~tvm_tcutils.processes.unpin`); TVM's workers stay
    pinned: unpinned, the scheduler at times left a worker on the main thread's core for seconds, halving
    TVM's 2-thread speed.
    """
    tvm.get_global_func("runtime.config_threadpool")(1, n)
    unpin()


def timeit(func, *args, min_ms: int = 200, repeat: int = 5) -> float:
    """Median ms per call of a compiled TVM function (:func:`tvm_tcutils.measure.time_function`)."""
    return time_function(func, args, repeat=repeat, min_repeat_ms=min_ms).median_ms


def time_ort(sess, feeds) -> SampleTimer:
    """A timer (ms) of an onnxruntime session on ``feeds``."""
    return onnx_session(sess, feeds, repeat=3, min_ms=100)


def graph_timer(lib, inputs, repeat: int = 3, min_ms: int = 100) -> SampleTimer:
    """A timer (ms) of one run of a built Relay graph (:class:`tvm_tcutils.measure.Timer`)."""
    return relay_module(None, lib=lib, inputs=inputs, repeat=repeat, warmup=1, min_repeat_ms=min_ms)


def nd(array):
    return tvm.nd.array(array, tvm.cpu())


# --------------------------------------------------------------------------
# Peak
# --------------------------------------------------------------------------
#: The register-only dot-product loop as a contender of :func:`bench_encoder_ops`' turns: a peak measured
#: once before the products reads a quiet spell of a shared machine against products timed in a noisy one
#: (an Ice Lake VM: the same kernel at 0.55-0.91 of a peak taken a minute earlier).
PEAK_IN_TURNS = "peak in turns"


def peak_timer(tasks: int, chains: int = 16, iters: int = 20_000) -> Tuple[SampleTimer, float]:
    """``(timer, gop)``: :func:`peak_gops`' loop as a timer of one sample in ms, and its billion operations
    per run.

    Examples
    --------
    >>> timer, gop = peak_timer(1, iters=100)
    >>> not for_target(TARGET).supports(tvm.target.Target(TARGET)) or timer() > 0
    True
    """
    isa = for_target(TARGET)
    lib = chain_kernel(isa, tasks, chains, iters, target=TARGET)
    return (te_function(lib, chain_arguments(isa, tasks, chains), repeat=3, min_repeat_ms=50),
            chain_gop(isa, tasks, chains, iters))


def peak_gops(tasks: int, chains: int = 16, iters: int = 100_000) -> float:
    """GOPS of ``chains`` independent dot-product accumulator chains per thread, all in registers
    (:func:`~tvm_tcutils.dotprod.cpu_facts.chain_gops` on :data:`TARGET`'s ISA: the instruction the
    kernels use)."""
    return chain_gops(for_target(TARGET), tasks, chains, iters, target=TARGET)


def amx_peak_gops(tasks: int, iters: int = 200_000) -> float:
    """GOPS of a register-only tile loop per thread: two data and two weight tiles loaded once, four
    accumulator tiles multiplied ``iters`` times (the step shape of the AMX kernels, through the package's
    own tile program, :class:`~tvm_tcutils.dotprod.topi.tiles.Tiles`)."""
    from ..dotprod.topi.tiles import Tiles, matrix

    isa = tile_isa(TARGET)
    variant = isa.variant("uint8", "int8")
    rows, width = isa.rows, isa.row_bytes

    def body(ins, outs):
        a, b = ins
        (c,) = outs
        ib = tvm.tir.ir_builder.create()
        with ib.for_range(0, tasks, name="task", kind="parallel") as task:
            tiles = Tiles(ib, isa, variant, [(rows, width)] * 4 + [(rows, width)] * 2 + [(width // 4, width)] * 2)
            for t in range(4):
                tiles.zero(t)
            for t in range(2):
                tiles.load(4 + t, matrix(a, t * rows, 0))
                tiles.load(6 + t, matrix(b, t * (width // 4), 0))
            with ib.for_range(0, iters, name="i"):
                for t in range(4):
                    tiles.multiply(t, 4 + t // 2, 6 + t % 2)
            for t in range(4):
                tiles.store(t, matrix(c, (task * 4 + t) * rows, 0, element_bytes=4))
        return ib.get()

    a = te.placeholder((2 * rows, width), "uint8", name="A")
    b = te.placeholder((width // 2, width), "int8", name="B")
    c = te.extern((tasks * 4 * rows, isa.columns), [a, b], body, dtype="int32", name="peak")
    lib = tvm.build(te.create_schedule(c.op), [a, b, c], target=TARGET)
    args = [nd(np.ones((2 * rows, width), "uint8")), nd(np.ones((width // 2, width), "int8")),
            nd(np.zeros([int(d) for d in c.shape], "int32"))]
    seconds = timeit(lib, *args, min_ms=100) / 1e3
    return tasks * iters * 4 * rows * isa.columns * width * 2 / seconds / 1e9


def avx2_peak_gops(tasks: int, chains: int = 12, iters: int = 1_000_000, saturating: bool = False) -> float:
    """GOPS of the exact AVX2 step's arithmetic, ``vpmaddwd`` + ``vpaddd``, on ``chains`` chains per thread.

    Each chain feeds its own accumulator back as the int16 operand
    (``acc += vpmaddwd(acc, k)``), so LLVM cannot hoist the step out of the loop
    as it does with loop-invariant operands; 12 chains of 4 cycles' latency keep
    both multiply pipes busy. One step is 16 multiply-adds (32 ops); the conv
    kernels need two per 32 products, so this is their ceiling.

    ``saturating=True`` times the usual inexact step instead (onnxruntime's on AVX2):
    ``acc += vpmaddwd(vpmaddubsw(acc, k), ones)``, 32 multiply-adds per step.
    """
    from ..dotprod.isa.base import llvm_intrin, reinterpret

    def step(acc):
        if not saturating:
            return llvm_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", reinterpret(acc, "int16x16"),
                               tir.Broadcast(tir.const(3, "int16"), 16))
        pairs = llvm_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", reinterpret(acc, "uint8x32"),
                            tir.Broadcast(tir.const(3, "int8"), 32))
        return llvm_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", pairs, tir.Broadcast(tir.const(1, "int16"), 16))

    def body(ins, outs):
        ib = tir.ir_builder.create()
        with ib.for_range(0, tasks, kind="parallel", name="t") as t:
            accs = [ib.allocate("int32x8", (1,), name=f"acc{r}", scope="local") for r in range(chains)]
            for r, acc in enumerate(accs):
                acc[0] = tir.Broadcast(tir.const(r + 1, "int32"), 8)
            with ib.for_range(0, iters, name="i"):
                for acc in accs:
                    acc[0] = acc[0] + step(acc[0])
            for r, acc in enumerate(accs):
                ib.emit(tir.BufferStore(outs[0], acc[0], [tir.Ramp((t * chains + r) * 8, 1, 8)]))
        return ib.get()

    c = te.extern((tasks * chains * 8,), [], body, dtype="int32", name="peak")
    lib = tvm.build(te.create_schedule(c.op), [c], target=TARGET)
    seconds = timeit(lib, nd(np.zeros(tasks * chains * 8, "int32")), min_ms=100) / 1e3
    return tasks * iters * chains * (32 if saturating else 16) * 2 / seconds / 1e9


# --------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------
def resnet50_layers():
    """Distinct (C, H, W, O, K, stride, pad) of ResNet-50's 1x1 and 3x3 convs, in order."""
    return conv_layers(load_model("resnet-50")[0], (1, 3))


def _build(task, log=None):
    """Build an AutoTVM task with its best config in ``log``, or the template's fallback config.

    Returns the function and its argument tensors (AutoTVM orders them output first).
    """
    target = tvm.target.Target(TARGET)
    if log:
        with autotvm.apply_history_best(log), target:
            sched, args = task.instantiate(autotvm.DispatchContext.current.query(target, task.workload))
    else:
        with target:
            sched, args = task.instantiate(autotvm.task.space.FallbackConfigEntity())
    return tvm.build(sched, args, target=TARGET), args


def _tune(task, trials: int, log_dir: str) -> str:
    log = os.path.join(log_dir, f"{task.name}_{abs(hash(task.workload))}.log")
    measure = autotvm.measure_option(builder=autotvm.LocalBuilder(),
                                     runner=PackageLocalRunner(number=3, repeat=1, min_repeat_ms=50, timeout=20))
    tuner = autotvm.tuner.XGBTuner(task, loss_type="reg")
    tuner.tune(n_trial=min(trials, len(task.config_space)), measure_option=measure,
               callbacks=[autotvm.callback.log_to_file(log)])
    return log


def ours(task_name: str, args, arrays, out_shape, trials: int, log_dir: str) -> Dict[str, SampleTimer]:
    """Build a template (untuned, and tuned when ``trials``); return ``{"ours untuned": timer, ...}``."""
    task = autotvm.task.create(task_name, args=args, target=TARGET)
    funcs = {"untuned": _build(task)}
    if trials:
        funcs["tuned"] = _build(task, _tune(task, trials, log_dir))
    by_type = {(a.shape, str(a.dtype)): nd(a) for a in arrays}
    by_type[(tuple(out_shape), "int32")] = nd(np.zeros(out_shape, "int32"))

    def buffers(tensors):
        return [by_type[(tuple(int(d) for d in t.shape), str(t.dtype))] for t in tensors]

    return {f"ours {name}": te_function(f, buffers(tensors), repeat=3, min_repeat_ms=100)
            for name, (f, tensors) in funcs.items()}


def ours_conv(layer, data, kernel, trials, log_dir, isa=None):
    """The packed conv2d template on ``layer`` for ``isa`` (default the target's; a reduce-range ISA
    gets its marked kernel, whose values the caller keeps in its range)."""
    c, h, w, o, k, stride, pad = layer
    isa = isa or for_target(TARGET)
    lanes = isa.lanes
    ic_bn = packing.channel_block(c, lanes)
    d_p, k_p = packing.pack_data_nchwc(data, ic_bn), packing.pack_kernel_for(isa, kernel, ic_bn)
    args = (te.placeholder(d_p.shape, "uint8"), te.placeholder(k_p.shape, k_p.dtype.name), (stride, stride),
            (pad, pad, pad, pad), (1, 1), f"NCHW{ic_bn}c", f"NCHW{lanes}c", "int32")
    h_o, w_o = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return ours(CONV2D_NCHWC_TASK, args, [d_p, k_p], (1, -(-o // lanes), h_o, w_o, lanes), trials, log_dir)


def _relay_conv(layer, dtype: str):
    c, h, w, o, k, stride, pad = layer
    x = relay.var("x", shape=(1, c, h, w), dtype=dtype)
    weight = RNG.integers(-128, 128, (o, c, k, k)).astype("int8" if dtype == "uint8" else dtype)
    y = relay.nn.conv2d(x, relay.const(weight), strides=(stride, stride), padding=(pad, pad), channels=o,
                        kernel_size=(k, k), out_dtype="int32" if dtype == "uint8" else "")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=TARGET)
    data = RNG.integers(0, 256, (1, c, h, w)).astype("uint8") if dtype == "uint8" else \
        RNG.standard_normal((1, c, h, w)).astype(dtype)
    return lib, {"x": data}


def _relay_qnn_conv(layer, data, kernel):
    """``QLinearConv``'s computation in Relay: qnn.conv2d + requantize, u8 NCHW in and out.

    The scales and zero points are those of :func:`_ort_qlinearconv`.
    """
    c, h, w, o, k, stride, pad = layer
    x = relay.var("x", shape=(1, c, h, w), dtype="uint8")
    y = relay.qnn.op.conv2d(
        x, relay.const(kernel), relay.const(0), relay.const(0), relay.const(0.05), relay.const(0.01),
        kernel_size=(k, k), channels=o, strides=(stride, stride), padding=(pad, pad), out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.05 * 0.01), relay.const(0), relay.const(0.5), relay.const(0),
                                out_dtype="uint8")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=TARGET)
    return lib, {"x": data}


def _ort_qlinearconv(layer, data, kernel, threads: int, nhwc: bool):
    from onnx import TensorProto, helper, numpy_helper

    c, h, w, o, k, stride, pad = layer
    scalars = [numpy_helper.from_array(np.array(v, dtype=d), n) for n, v, d in (
        ("xs", 0.05, "float32"), ("xz", 0, "uint8"), ("ws", 0.01, "float32"), ("wz", 0, "int8"),
        ("ys", 0.5, "float32"), ("yz", 0, "uint8"))]
    weights = numpy_helper.from_array(kernel, "w")
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    if nhwc:
        attrs["channels_last"] = 1
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            domain="com.microsoft" if nhwc else "", **attrs)
    x_shape = [1, h, w, c] if nhwc else [1, c, h, w]
    graph = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              initializer=[weights, *scalars])
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid("com.microsoft", 1)] if nhwc else [])
    sess = ort_session(helper.make_model(graph, opset_imports=opsets), threads)
    feed = np.ascontiguousarray(data.transpose(0, 2, 3, 1)) if nhwc else data
    return time_ort(sess, {"x": feed})


def _ort_fp32_conv(layer, threads: int):
    from onnx import TensorProto, helper, numpy_helper

    c, h, w, o, k, stride, pad = layer
    weights = numpy_helper.from_array(RNG.standard_normal((o, c, k, k)).astype("float32"), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[weights])
    sess = ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), threads)
    feed = {"x": RNG.standard_normal((1, c, h, w)).astype("float32")}
    return time_ort(sess, feed)


def bench_conv(layer, threads, trials, log_dir, rounds: int = 3):
    """GOPS of every contender on one conv layer, per thread count."""
    c, h, w, o, k, stride, pad = layer
    h_o, w_o = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    gop = 2 * c * o * k * k * h_o * w_o / 1e9
    data = RNG.integers(0, 256, (1, c, h, w)).astype("uint8")
    kernel = RNG.integers(-128, 128, (o, c, k, k)).astype("int8")
    timer = ours_conv(layer, data, kernel, trials, log_dir)
    graph_lib, graph_in = _relay_conv(layer, "uint8")
    qnn_lib, qnn_in = _relay_qnn_conv(layer, data, kernel)
    fp32_lib, fp32_in = _relay_conv(layer, "float32")
    narrow = range_isa(TARGET)
    if narrow is not None:
        # The same layer with reduce-range weights (what quantize_static(reduce_range=True) writes),
        # on the 8-bit step: the op alone, and the whole op, which the package routes there itself.
        kernel_rr = _reduce_range_weights(narrow, kernel.shape)
        timer["u8s7 op"] = ours_conv(layer, data, kernel_rr, 0, log_dir, narrow)["ours untuned"]
        rr_qnn_lib, _ = _relay_qnn_conv(layer, data, kernel_rr)
    rows = []
    for n in threads:
        set_threads(n)
        timers = {
            **timer,
            **({"u8s7 qnn": graph_timer(rr_qnn_lib, qnn_in)} if narrow is not None else {}),
            "ours graph": graph_timer(graph_lib, graph_in),
            "ours qnn": graph_timer(qnn_lib, qnn_in),
            "ORT QLinearConv": _ort_qlinearconv(layer, data, kernel, n, nhwc=False),
            "ORT NHWC": _ort_or_none(_ort_qlinearconv, layer, data, kernel, n, nhwc=True),
            "TVM fp32": graph_timer(fp32_lib, fp32_in),
            "ORT fp32": _ort_fp32_conv(layer, n),
        }
        rows.append((n, gops(timers, gop, rounds)))
    return rows


def _reduce_range_weights(isa, shape) -> np.ndarray:
    """Random int8 weights spanning ``isa.kernel_range`` (as ``quantize_static(reduce_range=True)`` writes them)."""
    low, high = isa.kernel_range
    return RNG.integers(low, high + 1, shape).astype("int8")


def _ort_or_none(fn, *args, **kwargs):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, NotImplemented as OrtNotImplemented

    try:
        return fn(*args, **kwargs)
    except (Fail, InvalidGraph, OrtNotImplemented) as err:  # e.g. a contrib op missing from this ORT build
        print(f"  ({fn.__name__} failed: {str(err).splitlines()[0][:100]})")
        return None


def _ort_qlinearmatmul(data, weight, threads: int):
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ascontiguousarray(weight.T), "w")] + [
        numpy_helper.from_array(np.array(v, dtype=d), n) for n, v, d in (
            ("as", 0.05, "float32"), ("az", 0, "uint8"), ("ws", 0.01, "float32"), ("wz", 0, "int8"),
            ("ys", 0.5, "float32"), ("yz", 0, "uint8"))]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "w", "ws", "wz", "ys", "yz"], ["y"])
    graph = helper.make_graph([node], "qmm", [helper.make_tensor_value_info("a", TensorProto.UINT8, list(data.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    sess = ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), threads)
    return time_ort(sess, {"a": data})


def _ort_fp32_gemm(m, k, n, threads):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(RNG.standard_normal((n, k)).astype("float32"), "w")
    node = helper.make_node("Gemm", ["a", "w"], ["y"], transB=1)
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[weight])
    sess = ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), threads)
    feed = {"a": RNG.standard_normal((m, k)).astype("float32")}
    return time_ort(sess, feed)


def bench_dense(m, k, n, threads, trials, log_dir, rounds: int = 3):
    """GOPS of the final ResNet-50 dense (m x k by n x k)."""
    lanes = for_target(TARGET).lanes
    gop = 2 * m * k * n / 1e9
    data = RNG.integers(0, 256, (m, k)).astype("uint8")
    weight = RNG.integers(-128, 128, (n, k)).astype("int8")
    w_p = packing.pack_dense_weight(weight, lanes)
    args = (te.placeholder(data.shape, "uint8"), te.placeholder(w_p.shape, "int8"), None, "int32")
    timer = ours(DENSE_PACK_TASK, args, [data, w_p], (m, w_p.shape[0] * lanes), trials, log_dir)
    narrow = range_isa(TARGET)
    if narrow is not None:  # reduce-range weights on the 8-bit step (its marked packing)
        w_rr = packing.pack_dense_weight(_reduce_range_weights(narrow, (n, k)), narrow.lanes, marked=True)
        rr_args = (te.placeholder(data.shape, "uint8"), te.placeholder(w_rr.shape, "int8"), None, "int32")
        timer["u8s7 op"] = ours(DENSE_PACK_TASK, rr_args, [data, w_rr], (m, w_rr.shape[0] * narrow.lanes), 0,
                                log_dir)["ours untuned"]
    x = relay.var("x", shape=(m, k))
    fp32_lib = _build_relay(relay.nn.dense(x, relay.const(RNG.standard_normal((n, k)).astype("float32"))), x)
    rows = []
    for t in threads:
        set_threads(t)
        timers = {
            **timer,
            "ORT QLinearMatMul": _ort_or_none(_ort_qlinearmatmul, data, weight, t),
            "TVM fp32": graph_timer(fp32_lib, {"x": RNG.standard_normal((m, k)).astype("float32")}),
            "ORT fp32": _ort_fp32_gemm(m, k, n, t),
        }
        rows.append((t, gops(timers, gop, rounds)))
    return rows


#: Encoder products at 128 tokens: (name, M, K, N) of the dense ops (bert-tiny: hidden 256; BERT-base: 768).
ENCODER_DENSE = (
    ("bert-tiny QKV/out 128x256x256", 128, 256, 256), ("bert-tiny FF up 128x256x1024", 128, 256, 1024),
    ("bert-tiny FF down 128x1024x256", 128, 1024, 256), ("BERT-base QKV/out 128x768x768", 128, 768, 768),
    ("BERT-base FF up 128x768x3072", 128, 768, 3072), ("BERT-base FF down 128x3072x768", 128, 3072, 768),
)
#: Attention's products of two activations: (name, heads, M, K, N), u8 x u8 as onnxruntime's QDQ files have them.
ENCODER_BATCH_MATMUL = (
    ("bert-tiny scores 4x128x64x128", 4, 128, 64, 128), ("bert-tiny context 4x128x128x64", 4, 128, 128, 64),
    ("BERT-base scores 12x128x64x128", 12, 128, 64, 128), ("BERT-base context 12x128x128x64", 12, 128, 128, 64),
)


def _ort_matmul_integer(a, b, threads: int):
    """onnxruntime's ``MatMulInteger`` (int32 out, zero points 0) of ``a`` by the constant ``b``."""
    from onnx import TensorProto, helper, numpy_helper

    types = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "mmi", [helper.make_tensor_value_info("a", types[str(a.dtype)], list(a.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                              initializer=[numpy_helper.from_array(b, "b")])
    sess = ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), threads)
    return time_ort(sess, {"a": a})


def bench_encoder_ops(threads, rounds: int = 5) -> list:
    """GOPS of an encoder's int8 products at 128 tokens: the package's dense and batch_matmul templates
    (untuned) against onnxruntime's ``MatMulInteger`` (int32 out, as ours) and ``QLinearMatMul`` (with its
    requantize), and the register-only peak loop (:data:`PEAK_IN_TURNS`, on an ISA :func:`peak_gops` measures);
    all in turns, per thread count. Returns ``(name, threads, {contender: GOPS})`` rows."""
    from ..dotprod.strategy import BATCH_MATMUL_AMX_TASK, BATCH_MATMUL_TASK

    isa = for_target(TARGET)
    lanes = isa.lanes
    peaks = {t: peak_timer(t) for t in threads} if isa.name == "x86_vnni" else {}
    rows = []

    def in_turns(timers, t, gop):
        if t in peaks:
            timers[PEAK_IN_TURNS] = peaks[t][0]
        return gops(timers, gop, rounds, gop_of={PEAK_IN_TURNS: peaks[t][1]} if t in peaks else None)

    with tempfile.TemporaryDirectory(prefix="bench_encoder_ops_") as log_dir:
        for name, m, k, n in ENCODER_DENSE:
            data = RNG.integers(0, 256, (m, k)).astype("uint8")
            weight = RNG.integers(-128, 128, (n, k)).astype("int8")
            w_p = packing.pack_dense_weight(weight, lanes)
            args = (te.placeholder(data.shape, "uint8"), te.placeholder(w_p.shape, "int8"), None, "int32")
            timer = ours(DENSE_PACK_TASK, args, [data, w_p], (m, w_p.shape[0] * lanes), 0, log_dir)
            if tile_isa(TARGET) is not None and lanes == tile_isa(TARGET).columns:
                # The tile kernel relay.build picks on this CPU, beside the VNNI kernel it replaces.
                amx = ours(DENSE_AMX_TASK, args, [data, w_p], (m, w_p.shape[0] * lanes), 0, log_dir)
                timer["ours AMX"] = amx["ours untuned"]
            for t in threads:
                set_threads(t)
                timers = {**timer, "ORT MatMulInteger": _ort_or_none(_ort_matmul_integer, data,
                                                                     np.ascontiguousarray(weight.T), t),
                          "ORT QLinearMatMul": _ort_or_none(_ort_qlinearmatmul, data, weight, t)}
                rows.append((name, t, in_turns(timers, t, 2 * m * k * n / 1e9)))
        for name, b, m, k, n in ENCODER_BATCH_MATMUL:
            x = RNG.integers(0, 256, (b, m, k)).astype("uint8")
            y = RNG.integers(0, 256, (b, n, k)).astype("uint8")
            args = (te.placeholder(x.shape, "uint8"), te.placeholder(y.shape, "uint8"), None, "int32", False, True)
            timer = ours(BATCH_MATMUL_TASK, args, [x, y], (b, m, n), 0, log_dir)
            if tile_isa(TARGET) is not None:
                timer["ours AMX"] = ours(BATCH_MATMUL_AMX_TASK, args, [x, y], (b, m, n), 0, log_dir)["ours untuned"]
            for t in threads:
                set_threads(t)
                # onnxruntime's MatMulInteger takes B as (batch, K, N); a constant here (an activation in a
                # model: onnxruntime then packs it per call, which this leaves out in its favour).
                timers = {**timer, "ORT MatMulInteger": _ort_or_none(_ort_matmul_integer, x,
                                                                     np.ascontiguousarray(y.transpose(0, 2, 1)), t)}
                rows.append((name, t, in_turns(timers, t, 2 * b * m * k * n / 1e9)))
    return rows


def encoder_ops_markdown(payload: Mapping) -> str:
    """The docs' per-op table from the JSON of ``scripts/bench_int8.py --encoder-ops`` (with the AMX
    kernels' columns where the run timed them); "of peak" is of the peak timed in turns with the row where the
    run has one (:data:`PEAK_IN_TURNS`), else of the one measured before.

    Examples
    --------
    >>> row = {"layer": "scores 4x128x64x128", "threads": 1, "peak_gops": 400.0,
    ...        "gops": {"ours untuned": 320.0, "ORT MatMulInteger": 160.0}}
    >>> print(encoder_ops_markdown({"rows": [row]}).splitlines()[-1])
    | scores 4x128x64x128 | 1 | 320 | 80.0% | 160 | - | x2.00 |
    >>> amx = dict(row, amx_peak_gops=4000.0, gops={"ours untuned": 320.0, "ours AMX": 2400.0,
    ...                                             "ORT MatMulInteger": 1600.0})
    >>> print(encoder_ops_markdown({"rows": [amx]}).splitlines()[-1])
    | scores 4x128x64x128 | 1 | 320 | 80.0% | 2400 | 60.0% | 1600 | - | x0.20 | x1.50 |
    """
    from .table import markdown

    tiles = any("ours AMX" in row["gops"] for row in payload["rows"])

    def number(value, form="{:.0f}"):
        return form.format(value) if value else "-"

    lines = []
    for row in payload["rows"]:
        gops = row["gops"]
        ours_gops, ort = gops.get("ours untuned"), gops.get("ORT MatMulInteger")
        amx, amx_peak = gops.get("ours AMX"), row.get("amx_peak_gops")
        peak = gops.get(PEAK_IN_TURNS) or row["peak_gops"]
        line = [row["layer"], row["threads"], f"{ours_gops:.0f}", f"{100 * ours_gops / peak:.1f}%"]
        if tiles:
            line += [number(amx), f"{100 * amx / amx_peak:.1f}%" if amx and amx_peak else "-"]
        line += [number(ort), number(gops.get("ORT QLinearMatMul")), f"x{ours_gops / ort:.2f}" if ort else "-"]
        if tiles:
            line.append(f"x{amx / ort:.2f}" if amx and ort else "-")
        lines.append(line)
    head = ["product", "threads", "tcutils GOPS (untuned)", "of peak"]
    head += ["tcutils AMX GOPS", "of AMX peak"] if tiles else []
    head += ["ORT MatMulInteger GOPS", "ORT QLinearMatMul GOPS", "tcutils / MatMulInteger"]
    head += ["AMX / MatMulInteger"] if tiles else []
    return markdown(head, lines)


def _build_relay(expr, *params):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(tvm.IRModule.from_expr(relay.Function(list(params), expr)), target=TARGET)


# --------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------
_REFERENCE = """
import sys, numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
mod = tvm.ir.load_json(open(sys.argv[1]).read())
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target="llvm")
run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
run.set_input(**dict(np.load(sys.argv[2])))
run.run()
np.save(sys.argv[3], run.get_output(0).numpy())
assert "tvm_tcutils" not in sys.modules
"""


#: Where onnxruntime-quantized zoo models are kept between runs (``$TVM_TCUTILS_CACHE`` overrides the parent).
QUANTIZED_CACHE = cache_dir("int8")


#: ONNX ops of a model that is already quantized.
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


def is_quantized(model) -> bool:
    """Whether an ONNX model (a ``ModelProto`` or an ``.onnx`` path) already holds quantized tensors: QDQ
    pairs, ``DynamicQuantizeLinear`` or onnxruntime's ``QLinear*`` ops.

    Examples
    --------
    >>> from tvm_tcutils.models import onnx_model
    >>> is_quantized(onnx_model("bert-tiny-onnx")), is_quantized("no-such-file.txt")
    (False, False)
    """
    if isinstance(model, str):
        if not (model.endswith(".onnx") and os.path.isfile(model)):
            return False
        import onnx

        model = onnx.load(model, load_external_data=False)
    return any(node.op_type in QUANTIZED_OPS or node.op_type.startswith("QLinear") for node in model.graph.node)


def ort_quantized(model: str, calibration: int = 4, cache_dir: str = None,
                  reduce_range: bool = False) -> Dict[str, str]:
    """``{"fp32", "qdq", "qoperator"}`` -> ONNX file: a model and its ``quantize_static`` versions.

    ``model`` is a zoo name (``resnet-50-onnx``) or a float ``.onnx`` file (an already quantized one,
    :func:`is_quantized`, is refused with a ``ValueError``). The quantized files
    (u8 activations, s8 per-channel weights -- 7-bit, in [-64, 64], with ``reduce_range`` --
    ``calibration`` random inputs) are written once into ``cache_dir`` (default
    :data:`QUANTIZED_CACHE`) and reused; a file's are named by its contents' hash too, so two
    files of one name do not share them.

    A file is prepared as onnxruntime's quantization guide has users do first, and that
    float file is ``fp32`` (what the float contenders run): weights listed among the graph's
    inputs (files written before ONNX IR version 4) taken out of them -- the quantizer cannot
    read such weights and the runtimes could not fold them -- and ``quant_pre_process``
    (shape inference, batch norms folded into their convs, which the quantizer would leave
    in float between the 8-bit convs). Their inputs' shapes must be fixed.
    """
    import hashlib

    import onnx

    from ..dotprod.quantize import ORT_FORMATS, ort_quantize
    from ..models import onnx_model

    folder = cache_dir or QUANTIZED_CACHE
    os.makedirs(folder, exist_ok=True)
    if model.endswith(".onnx"):
        with open(model, "rb") as fh:
            data = fh.read()
        stem = f"{os.path.splitext(os.path.basename(model))[0]}-{hashlib.sha256(data).hexdigest()[:10]}"
        float_model = onnx.load_model_from_string(data)
        if is_quantized(float_model):
            raise ValueError(f"model {model}: already quantized (QDQ or QLinear ops); give its float model")
        inputs = onnx_graph_inputs(float_model.graph)
        files = {"fp32": os.path.join(folder, f"{stem}-preprocessed.onnx")}
        if not os.path.exists(files["fp32"]):
            from onnxruntime.quantization.shape_inference import quant_pre_process

            del float_model.graph.input[:]
            float_model.graph.input.extend(inputs)
            # From a file: given the ModelProto, onnxruntime 1.32 writes its small initializers
            # as external data it then cannot find.
            with atomic_path(files["fp32"], suffix=".onnx") as partial, \
                    tempfile.TemporaryDirectory(dir=folder) as scratch:
                stripped = os.path.join(scratch, "stripped.onnx")
                onnx.save(float_model, stripped)
                # The symbolic step (sympy, not a dependency) is for dynamic shapes; these are fixed.
                quant_pre_process(stripped, partial, skip_symbolic_shape=True)
    else:
        stem = model
        files = {"fp32": os.path.join(folder, f"{stem}.onnx")}
        if not os.path.exists(files["fp32"]):
            with atomic_path(files["fp32"], suffix=".onnx") as partial:
                onnx.save(onnx_model(model), partial)
        inputs = onnx_graph_inputs(onnx.load(files["fp32"]).graph)
    samples = [{value.name: RNG.standard_normal([d.dim_value for d in value.type.tensor_type.shape.dim])
                .astype("float32") for value in inputs} for _ in range(calibration)]
    for fmt in ORT_FORMATS:
        files[fmt] = os.path.join(folder, f"{stem}-{fmt}-per-channel{'-rr' * reduce_range}-cal{calibration}.onnx")
        if not os.path.exists(files[fmt]):
            ort_quantize(files["fp32"], files[fmt], samples, fmt, per_channel=True, reduce_range=reduce_range)
    return files


def _openvino_timer(path: str, feed, threads: int) -> Optional[SampleTimer]:
    """OpenVINO's CPU plugin on an ONNX file (it runs QDQ models in int8), or None if not installed."""
    try:
        return openvino_file(path, feed, threads)
    except ImportError:
        print("OpenVINO not installed: its column stays empty")
        return None


def _model_timers(libs, files: Mapping[str, str], ort_columns, feed, threads: int) -> Dict[str, SampleTimer]:
    """Timers of built modules (``libs``: column -> lib) and of onnxruntime on ``files`` (``ort_columns``:
    (column, key of ``files``) pairs) at ``threads`` threads."""
    import onnx

    timers = {column: graph_timer(lib, feed, 5, 200) for column, lib in libs.items()}
    timers.update({column: time_ort(ort_session(onnx.load(files[key]), threads), feed)
                   for column, key in ort_columns})
    return timers


def _in_turns(timers, columns, baselines: Mapping[str, str], rounds: int, title: str) -> dict:
    """Time ``timers`` in turns; print each column's median and its ratio to every baseline; the JSON row.

    ``columns``: (column, runtime, what it runs) rows, in print order; ``baselines``: JSON key ->
    baseline column (``{"vs_ort_qdq": "ORT QDQ"}``).

    Examples
    --------
    >>> row = _in_turns({"a": lambda: 1.0, "b": lambda: 2.0}, (("a", "x", "y"), ("b", "x", "y")),
    ...                 {"vs_b": "b"}, 2, "two contenders:")  # doctest: +ELLIPSIS
    two contenders:
      a ...
    >>> sorted(row), row["vs_b"]["a"]["value"]
    (['timings', 'vs_b'], 0.5)
    """
    from .competitors import ratios

    timed = compare({column: timers[column] for column, _, _ in columns}, rounds=rounds)
    by_baseline = {key: ratios(timed, column) for key, column in baselines.items()}
    width = max(len(column) for column, _, _ in columns) + 2
    print(title)
    for column, runtime, what in columns:
        cells = "  ".join(f"vs {baselines[key]} {r[column]}" for key, r in by_baseline.items())
        print(f"  {column:<{width}} {str(timed[column]):<32} {cells}   ({runtime}: {what})", flush=True)
    return {"timings": {column: timing.as_dict() for column, timing in timed.items()},
            **{key: {column: r.as_dict() for column, r in rs.items()} for key, rs in by_baseline.items()}}


#: End-to-end contenders: (column, runtime, what it runs).
E2E_COLUMNS = (
    ("tcutils relay.quantize", "tvm-tcutils", "relay.quantize of the float model"),
    ("tcutils QOperator", "tvm-tcutils", "onnxruntime QOperator file (from_onnx)"),
    ("tcutils QDQ", "tvm-tcutils", "onnxruntime QDQ file (from_onnx, QDQ regions made integer)"),
    ("ORT QOperator", "onnxruntime", "QOperator file"),
    ("ORT QDQ", "onnxruntime", "QDQ file"),
    ("OpenVINO QDQ", "OpenVINO", "QDQ file"),
    ("TVM fp32", "TVM", "float model"),
    ("ORT fp32", "onnxruntime", "float model"),
)


def bench_e2e(threads, check: bool, log: str = None, model: str = "resnet-50-onnx", rounds: int = 5):
    """int8 ``model`` end to end: the package's three int8 routes against onnxruntime and OpenVINO.

    Every contender of one thread count is timed in turns (``rounds`` rounds); each row prints the
    medians and every int8 contender's ratio to onnxruntime (QDQ) and OpenVINO (QDQ) with its
    bootstrap interval. Returns the rows (JSON-ready).
    """
    import onnx

    from ..dotprod.quantize import quantize_int8
    from ..measure import build

    files = ort_quantized(model)
    mod, params = relay.frontend.from_onnx(onnx.load(files["fp32"]), freeze_params=True)
    name = onnx_graph_inputs(onnx.load(files["fp32"]).graph)[0].name
    shape = [int(d) for d in mod["main"].params[0].checked_type.shape]
    feed = {name: RNG.standard_normal(shape).astype("float32")}
    qmod, seconds = timed_once(lambda: quantize_int8(mod, params))
    print(f"relay.quantize: {seconds:.0f} s")
    libs = {}
    for column, source in (("tcutils relay.quantize", qmod), ("TVM fp32", mod)):
        libs[column], seconds = timed_once(lambda m=source: build(m, params if m is mod else {}, TARGET, log))
        print(f"{column} build: {seconds:.0f} s")
    for column, fmt in (("tcutils QOperator", "qoperator"), ("tcutils QDQ", "qdq")):
        qonnx = relay.frontend.from_onnx(onnx.load(files[fmt]), {name: shape}, freeze_params=True)[0]
        libs[column], seconds = timed_once(lambda m=qonnx: build(m, None, TARGET, log))
        print(f"{column} build: {seconds:.0f} s")
    rows = []
    for n in threads:
        set_threads(n)
        timers = _model_timers(libs, files, (("ORT QOperator", "qoperator"), ("ORT QDQ", "qdq"), ("ORT fp32", "fp32")),
                               feed, n)
        timers["OpenVINO QDQ"] = _openvino_timer(files["qdq"], feed, n)
        title = f"{model} threads={n} (ms, median of {rounds} interleaved rounds +- half the interquartile range):"
        rows.append({"threads": n, "model": model, **_in_turns(
            timers, E2E_COLUMNS, {"vs_ort_qdq": "ORT QDQ", "vs_openvino_qdq": "OpenVINO QDQ"}, rounds, title)})
    if check:
        _check_against_generic(libs["tcutils relay.quantize"], qmod, feed)
    return rows


#: Reduce-range contenders: (column, runtime, what it runs). All on files quantized with ``reduce_range=True``.
REDUCE_RANGE_COLUMNS = (
    ("tcutils exact", "tvm-tcutils", "QDQ file, every layer on the exact step (dotprod.isa.exact_only)"),
    ("tcutils reduce-range", "tvm-tcutils", "QDQ file, layers with weights in [-64, 64] on vpmaddubsw"),
    ("ORT QDQ", "onnxruntime", "QDQ file"),
    ("ORT QOperator", "onnxruntime", "QOperator file"),
)


def bench_reduce_range(threads, model: str = "resnet-50-onnx", rounds: int = 5):
    """``model`` quantized by onnxruntime with ``reduce_range=True``: the package's exact and
    reduce-range builds for :data:`TARGET` against onnxruntime on the same files.

    Checks first that the two builds give the same bytes (and how far onnxruntime is), then times
    every contender of one thread count in turns; each row prints medians and ratios to
    onnxruntime (QDQ) and to the exact build with bootstrap intervals. Returns the rows.
    """
    import onnx

    from ..dotprod.isa import exact_only
    from ..measure import build, outputs

    files = ort_quantized(model, reduce_range=True)
    name = onnx_graph_inputs(onnx.load(files["fp32"]).graph)[0].name
    qmod = relay.frontend.from_onnx(onnx.load(files["qdq"]), freeze_params=True)[0]
    shape = [int(d) for d in qmod["main"].params[0].checked_type.shape]
    feed = {name: RNG.standard_normal(shape).astype("float32")}
    libs = {}
    with exact_only():
        libs["tcutils exact"], seconds = timed_once(lambda: build(qmod, None, TARGET))
    print(f"tcutils exact build: {seconds:.0f} s")
    libs["tcutils reduce-range"], seconds = timed_once(lambda: build(qmod, None, TARGET))
    steps = libs["tcutils reduce-range"].get_lib().get_source("asm").count("vpmaddubsw")
    print(f"tcutils reduce-range build: {seconds:.0f} s, {steps} vpmaddubsw in its code")
    results = {}
    for column, lib in libs.items():
        run = graph_module(lib, feed)
        run.run()
        results[column] = outputs(run)[0]
    expected = ort_session(onnx.load(files["qdq"]), 1).run(None, feed)[0]
    same = np.array_equal(results["tcutils exact"], results["tcutils reduce-range"])
    print(f"reduce-range output == exact output: {same}; max |ours - ORT QDQ| "
          f"{np.abs(results['tcutils reduce-range'].astype(float) - expected).max()}")
    rows = []
    for n in threads:
        set_threads(n)
        timers = _model_timers(libs, files, (("ORT QDQ", "qdq"), ("ORT QOperator", "qoperator")), feed, n)
        title = f"{model} reduce_range threads={n} (ms, median of {rounds} interleaved rounds):"
        rows.append({"threads": n, "model": model, "bit_exact_vs_exact_build": same, "vpmaddubsw": steps,
                     **_in_turns(timers, REDUCE_RANGE_COLUMNS, {"vs_ort_qdq": "ORT QDQ", "vs_exact": "tcutils exact"},
                                 rounds, title)})
    return rows


def _check_against_generic(int8_lib, qmod, inputs) -> None:
    """The package's int8 build vs TVM's generic ``llvm`` build in a process without the package."""
    run = graph_module(int8_lib, inputs)
    run.run()
    ours_out = run.get_output(0).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/m.json", "w") as f:
            f.write(tvm.ir.save_json(qmod))
        np.savez(f"{tmp}/in.npz", **inputs)
        env = dict(os.environ, PYTHONPATH="")
        subprocess.run([sys.executable, "-c", _REFERENCE, f"{tmp}/m.json", f"{tmp}/in.npz", f"{tmp}/ref.npy"],
                       check=True, env=env)
        ref = np.load(f"{tmp}/ref.npy")
    print(f"int8 output bit-exact vs TVM generic llvm (no tvm_tcutils): {np.array_equal(ours_out, ref)}"
          f" (max abs diff {np.abs(ours_out.astype(float) - ref).max()})")


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------
# --------------------------------------------------------------------------
# Layout transforms
# --------------------------------------------------------------------------
def transform_shapes(isa):
    """Distinct u8 ``layout_transform`` cases around ResNet-50's convs: (C, H, W, b), data and outputs; first
    an RGB image padded for its 7x7 stem (3 channels and a fourth, 230x230: no row block of whole tiles)."""
    cases = [(4, 230, 230, 4)]
    for c, h, w, o, k, stride, pad in resnet50_layers():
        out_h = (h + 2 * pad - k) // stride + 1
        for case in ((c, h, w, packing.channel_block(c, isa.lanes)),
                     (o, out_h, out_h, packing.channel_block(o, isa.lanes))):
            if case not in cases:
                cases.append(case)
    return cases


def bench_transforms(isa, threads):
    """TVM's x86 injective schedule vs the package's byte-shuffle schedule, side by side (GB/s moved)."""
    from tvm import topi

    from ..dotprod.topi.layout_transform import byte_tile_plan, schedule_byte_layout_transform

    print("u8 layout transforms (GB/s: bytes read + written per second; same compute, two schedules)")
    for c, h, w, block in transform_shapes(isa):
        for src, dst, shape in (("NCHW", f"NCHW{block}c", (1, c, h, w)),
                                (f"NCHW{block}c", "NCHW", (1, c // block, h, w, block))):
            x = te.placeholder(shape, "uint8", name="x")
            y = topi.layout_transform(x, src, dst)
            data = tvm.nd.array(RNG.integers(0, 256, shape).astype("uint8"))
            out = tvm.nd.empty([int(v) for v in y.shape], "uint8")
            plan = byte_tile_plan(src, dst, shape, "uint8")
            funcs = {"tvm": tvm.build(topi.x86.schedule_injective([y]), [x, y], TARGET)}
            if plan is not None:
                funcs["ours"] = tvm.build(schedule_byte_layout_transform(y, src, dst), [x, y], TARGET)
            cells = []
            for n in threads:
                set_threads(n)
                speed = {name: 2 * c * h * w / (timeit(f, data, out) / 1e3) / 1e9 for name, f in funcs.items()}
                ratio = f"x{speed['ours'] / speed['tvm']:4.2f}" if "ours" in speed else "(no plan: TVM's)"
                cells.append(f"t={n} tvm {speed['tvm']:6.1f} ours {speed.get('ours', float('nan')):6.1f} {ratio}")
            print(f"{src:>8} -> {dst:<8} {c:5d}x{h}x{w}  " + "  ".join(cells), flush=True)


#: 8-bit constant pads (shape, pad before/after the last two axes): the QDQ stem's zero-point pad of an
#: RGB image, a 112x112 plane, then blocked (NCHW16c) pads the row schedule leaves to TVM.
PAD_CASES = (((1, 3, 224, 224), 3), ((1, 64, 112, 112), 1), ((1, 4, 56, 56, 16), 1), ((1, 32, 7, 7, 16), 1))


def bench_pads(threads, rounds: int = 5):
    """TVM's x86 injective schedule vs :func:`~tvm_tcutils.dotprod.topi.pad.schedule_row_pad` on u8 pads,
    timed in turns; rows ``{shape, threads, tvm_us, ours_us, ratio}`` (TVM's time over ours)."""
    from tvm import topi

    from ..dotprod.topi.pad import row_pad_applies, schedule_row_pad

    rows = []
    for shape, width in PAD_CASES:
        blocked = len(shape) == 5
        before = [0, 0, width, width] + [0] * blocked
        x = te.placeholder(shape, "uint8", name="x")
        y = topi.nn.pad(x, before, before, pad_value=tir.const(3, "uint8"))
        data = tvm.nd.array(RNG.integers(0, 256, shape).astype("uint8"))
        out = tvm.nd.empty([int(v) for v in y.shape], "uint8")
        funcs = {"tvm": tvm.build(topi.x86.schedule_injective([y]), [x, y], TARGET),
                 "ours": tvm.build(schedule_row_pad(y), [x, y], TARGET)}
        applies = row_pad_applies(list(zip(before, before)), "uint8")
        for n in threads:
            row = _tvm_against_ours(funcs, {name: [data, out] for name in funcs}, n, rounds)
            rows.append({"layer": f"pad u8 {shape} by {width}", "threads": n, **row, "row_schedule_applies": applies})
            print(f"pad u8 {str(shape):<20} by {width}  t={n}  TVM {row['tvm_us']:7.2f} us  row schedule "
                  f"{row['ours_us']:7.2f} us  x{row['tvm_over_ours']:.2f} [{row['interval'][0]:.2f}, "
                  f"{row['interval'][1]:.2f}]{'' if applies else '  (blocked: not taken, TVM keeps it)'}", flush=True)
    return rows


def _tvm_against_ours(funcs: Mapping, args: Mapping, threads: int, rounds: int) -> dict:
    """TVM's build (``funcs["tvm"]``) and the package's (``"ours"``) of one op on ``args[name]``, timed in
    turns at ``threads``: ``{tvm_us, ours_us, tvm_over_ours, interval}`` (TVM's time over ours, 95 %)."""
    from .competitors import ratios

    set_threads(threads)
    timed = compare({name: te_function(f, args[name], repeat=3, min_repeat_ms=50) for name, f in funcs.items()},
                    rounds)
    ratio = ratios(timed, "ours")["tvm"]
    return {"tvm_us": timed["tvm"].median_ms * 1e3, "ours_us": timed["ours"].median_ms * 1e3,
            "tvm_over_ours": ratio.value, "interval": [ratio.low, ratio.high]}


#: u8 x i8 depthwise convs (channels, height = width, kernel, stride, padding): MobileNet-v2's 3x3, then
#: EfficientNet-B0's and MobileNet-v3's 5x5 (rows of two quads), and a 7x7.
DEPTHWISE_CASES = ((144, 56, 3, 1, 1), (480, 14, 3, 1, 1), (144, 56, 5, 2, 2), (240, 28, 5, 1, 2),
                   (672, 14, 5, 1, 2), (1152, 7, 5, 1, 2), (256, 14, 7, 1, 3))


def bench_depthwise(threads, rounds: int = 5):
    """TVM's x86 ``depthwise_conv2d_NCHWc`` vs :func:`~tvm_tcutils.dotprod.topi.depthwise.depthwise_nchwc_dot`
    (the kernels alone: ``NCHW16c`` u8 data, ``OIHW1i16o`` i8 kernel, int32 out), outputs checked equal,
    timed in turns; rows ``{layer, threads, tvm_us, ours_us, tvm_over_ours, interval}``."""
    from tvm import topi

    from ..dotprod.topi.depthwise import depthwise_nchwc_dot, schedule_depthwise_nchwc_dot

    rows = []
    for channels, size, taps, stride, pad in DEPTHWISE_CASES:
        blocks = channels // 16
        x = te.placeholder((1, blocks, size, size, 16), "uint8", name="x")
        k = te.placeholder((blocks, 1, taps, taps, 1, 16), "int8", name="k")
        with tvm.target.Target(TARGET):
            theirs = topi.x86.depthwise_conv2d_NCHWc(x, k, stride, pad, 1, "NCHW16c", "NCHW16c", "int32")
            ours = depthwise_nchwc_dot(x, k, stride, pad, 1)
            funcs = {"tvm": tvm.build(topi.x86.schedule_depthwise_conv2d_NCHWc([theirs]), [x, k, theirs], TARGET),
                     "ours": tvm.build(schedule_depthwise_nchwc_dot([ours]), [x, k, ours], TARGET)}
        data = tvm.nd.array(RNG.integers(0, 256, [int(v) for v in x.shape]).astype("uint8"))
        kernel = tvm.nd.array(RNG.integers(-128, 128, [int(v) for v in k.shape]).astype("int8"))
        outs = {name: tvm.nd.empty([int(v) for v in ours.shape], "int32") for name in funcs}
        for name, func in funcs.items():
            func(data, kernel, outs[name])
        if not np.array_equal(outs["tvm"].numpy(), outs["ours"].numpy()):
            raise RuntimeError(f"depthwise {channels}x{size}x{size} {taps}x{taps}: the two kernels disagree")
        layer = f"depthwise {taps}x{taps} {channels}x{size}x{size} s{stride}"
        for n in threads:
            row = _tvm_against_ours(funcs, {name: [data, kernel, outs[name]] for name in funcs}, n, rounds)
            rows.append({"layer": layer, "threads": n, **row})
            print(f"{layer:<34} t={n}  TVM {row['tvm_us']:7.1f} us  ours {row['ours_us']:7.1f} us  "
                  f"x{row['tvm_over_ours']:.2f} [{row['interval'][0]:.2f}, {row['interval'][1]:.2f}]", flush=True)
    return rows


def report(name, rows, peaks):
    for n, row in rows:
        peak = peaks.get(n)
        best_ours = max(v for key, v in row.items() if key.startswith("ours") and key not in ("ours graph", "ours qnn"))
        ort = row.get("ORT QLinearConv", row.get("ORT QLinearMatMul"))
        cells = "  ".join(f"{key} {value:7.1f}" for key, value in row.items())
        of_peak = f"{best_ours / peak:5.1%}" if peak else "  n/a"
        print(f"{name:<34} t={n}  {cells}  | ours/peak {of_peak}  ours/ORT x{best_ours / ort:4.2f}"
              f"  qnn/ORT x{row.get('ours qnn', best_ours) / ort:4.2f}", flush=True)


