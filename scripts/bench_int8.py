#!/usr/bin/env python
"""Benchmark the int8 dot-product conv2d / dense against the CPU's int8 peak, onnxruntime and fp32.

For every distinct ResNet-50 3x3 and 1x1 conv layer and the final dense, at each
thread count, in one process (ratios are measured side by side):

* ``ours op``: the tensorized packed kernel alone (NCHW16c data, packed weights, int32 out),
  untuned (fallback config) and, with ``--trials N``, after N XGBTuner trials;
* ``ours graph``: a one-conv Relay model (u8 NCHW in, int32 NCHW out) built with the
  package's hooks, layout transforms included;
* ``ours qnn``: the same as ``QLinearConv`` computes it -- ``qnn.conv2d`` + ``qnn.requantize``,
  u8 NCHW in and u8 NCHW out -- built with the package's hooks (requantize fused into the
  conv, layout transforms included): the whole-op comparison with onnxruntime;
* ``ORT QLinearConv`` (NCHW, ONNX op) and ``ORT NHWC`` (``com.microsoft.QLinearConv``,
  ``channels_last=1``), whole op with requantize; QLinearMatMul for the dense;
* ``u8s7 op`` / ``u8s7 qnn`` (AVX2 targets without VNNI): ``ours op`` / ``ours qnn`` with weights in
  [-64, 64] (reduce-range), which run on the 8-bit ``vpmaddubsw`` step, exactly (onnxruntime's speed
  does not depend on the weights' values, so its columns serve both);
* ``TVM fp32`` (TVM's own x86 schedule, same target) and ``ORT fp32`` (MLAS);
* ``peak``: on VNNI a register-only ``vpdpbusd`` loop through the package's own tensor
  intrinsic, 16 independent accumulator chains per thread; on AVX2 the exact step's arithmetic
  (``vpmaddwd`` + ``vpaddd``) on 12 chains that feed their accumulators back as operands (with
  loop-invariant operands LLVM would hoist the arithmetic out of the loop). None for SSE.

The target is this CPU's (``tvm_tcutils.host_target()``) unless ``--target`` says otherwise; it
must have an x86 dot-product ISA (VNNI, AVX2 or SSE4.2).

``--e2e`` adds the zoo's ``resnet-50-onnx`` end to end (``--e2e-model`` another zoo name or an
``.onnx`` file), int8 three ways with the package -- ``relay.quantize`` of the float model, and
the files onnxruntime's ``quantize_static`` writes (u8 activations, s8 per-channel weights;
cached under ``~/.cache/tvm-tcutils/int8``) in QOperator and in QDQ format, imported with
``relay.frontend.from_onnx`` -- side by side with onnxruntime on both files, OpenVINO on the
QDQ file, and fp32 TVM and onnxruntime: every contender of a thread count timed in turns,
``--rounds`` rounds, ratios to onnxruntime (QDQ) and to OpenVINO with bootstrap intervals.
``--e2e-check`` compares the ``relay.quantize`` build's output bit for bit with TVM's generic
``llvm`` build run in a subprocess that does not import the package.

``--reduce-range`` (with ``--target "llvm -mcpu=core-avx2"``, or on an AVX2 CPU without VNNI)
times ``--e2e-model`` quantized by onnxruntime with ``reduce_range=True`` (7-bit weights): the
package's build with every layer on the exact step against its default build, where those layers
take the 8-bit ``vpmaddubsw`` step (and are checked to give the same bytes), and onnxruntime on the
QDQ and QOperator files, in turns, with ratios and their intervals. onnxruntime picks its kernels
from the CPU it runs on, so its column is an AVX2 one only on an AVX2 CPU without VNNI.

``--encoder-ops`` times an encoder's int8 products at 128 tokens (``bench_encoder_ops``): the dense
template at bert-tiny's and BERT-base's projection shapes and the u8 x u8 ``batch_matmul`` template at
their attention shapes, against onnxruntime's ``MatMulInteger`` (int32 out, as ours) and
``QLinearMatMul``, with the measured peak; on VNNI the peak loop also takes its turn with every row
(``peak in turns``), and "ours/peak" is of that one.

``--pads-only`` times u8 constant pads (an image's zero-point pad: TVM's schedule against the
package's row schedule). ``--transforms-only`` times the u8 ``layout_transform`` ops around those convs (``NCHW`` <->
``NCHW{b}c``) with TVM's x86 injective schedule and with the package's byte-shuffle schedule.

The contenders live in ``tvm_tcutils.bench.int8``; every timing goes through
``tvm_tcutils.measure``; the per-layer rows are also written as JSON (``--json``).

Usage::

    PYTHONPATH=. python scripts/bench_int8.py --threads 1 2 [--trials 16] [--e2e]
    PYTHONPATH=. python scripts/bench_int8.py --threads 1 2 --transforms-only
    PYTHONPATH=. python scripts/bench_int8.py --threads 1 2 --pads-only --json docs/benchmarks/data/bench_int8_pads.json
    PYTHONPATH=. python scripts/bench_int8.py --threads 1 2 --depthwise-only --rounds 9 \
        --json docs/benchmarks/data/bench_int8_depthwise_s29.json
    PYTHONPATH=. python scripts/bench_int8.py --threads 1 --encoder-ops \
        --json docs/benchmarks/data/bench_int8_encoder_ops.json
    PYTHONPATH=. python scripts/bench_int8.py --threads 1 --e2e-only --e2e-model resnet-50-onnx --rounds 5
    PYTHONPATH=. python scripts/bench_int8.py --threads 1 2 --reduce-range --target "llvm -mcpu=core-avx2"
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402,F401  (installs the hooks)
from tvm_tcutils.bench import int8  # noqa: E402
from tvm_tcutils.bench.int8 import (  # noqa: E402
    amx_peak_gops, avx2_peak_gops, bench_conv, bench_dense, bench_depthwise, bench_e2e, bench_encoder_ops, bench_pads,
    bench_reduce_range, bench_transforms,
    peak_gops, report, resnet50_layers, set_threads,
)
from tvm_tcutils.bench.competitors import add_timing_arguments, use_timing_arguments  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import timings_markdown  # noqa: E402
from tvm_tcutils.dotprod.isa import for_target, range_isa, tile_isa  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--trials", type=int, default=0, help="XGBTuner trials per layer (0: untuned only)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="per layer, time the contenders in turns this many times (median)")
    parser.add_argument("--layers", type=int, default=0, help="only the first N conv layers (0: all)")
    parser.add_argument("--e2e", action="store_true", help="also int8 ResNet-50 end to end")
    parser.add_argument("--e2e-check", action="store_true", help="with --e2e: bit-exact check vs TVM generic")
    parser.add_argument("--e2e-only", action="store_true", help="skip the per-layer table")
    parser.add_argument("--tuning-log", default=None, metavar="PATH",
                        help="AutoTVM log applied to the end-to-end builds (from 'tvm-tcutils tune' or "
                             "tvm_tcutils.tuning.tune on the same model; default: untuned)")
    parser.add_argument("--e2e-model", default="resnet-50-onnx",
                        help="zoo ONNX model or .onnx file for --e2e (a small one checks the script quickly)")
    parser.add_argument("--target", default=None, help="TVM target (default: this CPU's)")
    parser.add_argument("--transforms-only", action="store_true",
                        help="only the u8 layout transforms around ResNet-50's convs (TVM's schedule vs ours)")
    parser.add_argument("--pads-only", action="store_true",
                        help="only u8 constant pads (TVM's injective schedule vs the package's row schedule)")
    parser.add_argument("--depthwise-only", action="store_true",
                        help="only u8 x i8 depthwise convs, 3x3 to 7x7 (TVM's x86 kernel vs the package's)")
    parser.add_argument("--encoder-ops", action="store_true",
                        help="only an encoder's int8 dense and batch_matmul at 128 tokens (bert-tiny, BERT-base "
                             "shapes) against onnxruntime's MatMulInteger / QLinearMatMul and the peak")
    parser.add_argument("--reduce-range", action="store_true",
                        help="only --e2e-model with 7-bit weights: exact vs reduce-range build vs onnxruntime")
    add_json_argument(parser, __file__)
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    use_timing_arguments(args)
    # TVM sizes its pool from TVM_NUM_THREADS when it first runs (by default half the logical
    # CPUs here): without this a "2-thread" row ran TVM on one thread.
    os.environ["TVM_NUM_THREADS"] = str(max(args.threads))
    int8.TARGET = TARGET = args.target or int8.TARGET
    isa = for_target(TARGET)
    if isa is None or not isa.name.startswith("x86"):
        raise SystemExit(f"{TARGET} has no x86 dot-product ISA (VNNI, AVX2 or SSE4.2)")
    print(f"target {TARGET}: ISA {isa.name}, {isa.lanes} int32 lanes")
    print(f"host: {os.cpu_count()} logical CPUs; other processes may load the machine: compare ratios, "
          f"not absolute numbers (all columns GOPS)")
    results = Results(__file__, argv, target=TARGET, isa=isa.name, threads=args.threads, trials=args.trials,
                      rounds=args.rounds, tuning_log=args.tuning_log)
    if args.transforms_only:
        bench_transforms(isa, args.threads)
        return 0
    if args.pads_only:
        for row in bench_pads(args.threads, rounds=max(args.rounds, 5)):
            results.add(**row)
        results.write(args.json)
        return 0
    if args.depthwise_only:
        if isa.name != "x86_vnni":
            raise SystemExit(f"{TARGET}: the package's depthwise kernel is AVX-512 VNNI's (this target: {isa.name})")
        for row in bench_depthwise(args.threads, rounds=max(args.rounds, 5)):
            results.add(**row)
        results.write(args.json)
        return 0
    if args.reduce_range:
        if range_isa(TARGET) is None:
            raise SystemExit(f"{TARGET} has no reduce-range step (AVX2 without VNNI): use --target "
                             f"'llvm -mcpu=core-avx2'")
        for row in bench_reduce_range(args.threads, model=args.e2e_model, rounds=max(args.rounds, 3)):
            results.add(layer=f"reduce-range {row.pop('model')}", **row)
        results.write(args.json)
        return 0
    peaks = {}
    for n in args.threads:
        set_threads(n)
        peak = {"x86_vnni": peak_gops, "x86_avx2": avx2_peak_gops}.get(isa.name)
        if peak is None:
            print(f"no int8 peak microbenchmark for {isa.name}")
            continue
        peaks[n] = max(peak(n) for _ in range(3))  # the best of three: the machine is shared
        print(f"measured int8 peak (register-only {isa.name} loop), {n} thread(s): {peaks[n]:.0f} GOPS")
        if isa.name == "x86_avx2":
            inexact = max(avx2_peak_gops(n, saturating=True) for _ in range(3))
            print(f"  for reference, the saturating vpmaddubsw+vpmaddwd step (not exact): {inexact:.0f} GOPS")
    amx_peaks = {}
    if tile_isa(int8.TARGET) is not None:
        for n in args.threads:
            set_threads(n)
            amx_peaks[n] = max(amx_peak_gops(n) for _ in range(3))
            print(f"measured int8 peak (register-only AMX tile loop), {n} thread(s): {amx_peaks[n]:.0f} GOPS")
    if args.encoder_ops:
        for name, n, row in bench_encoder_ops(args.threads, max(args.rounds, 3)):
            # The peak timed in turns with the row where there is one: the machine may be shared.
            peak, ort = row.get(int8.PEAK_IN_TURNS) or peaks.get(n), row.get("ORT MatMulInteger")
            cells = "  ".join(f"{key} {value:7.1f}" for key, value in row.items())
            print(f"{name:<34} t={n}  {cells}  | ours/peak "
                  f"{row['ours untuned'] / peak if peak else float('nan'):5.1%}  ours/ORT MatMulInteger "
                  f"x{row['ours untuned'] / ort if ort else float('nan'):4.2f}", flush=True)
            if "ours AMX" in row:
                print(f"{'':<34} AMX/peak {row['ours AMX'] / amx_peaks[n]:5.1%}  AMX/ORT MatMulInteger "
                      f"x{row['ours AMX'] / ort if ort else float('nan'):4.2f}", flush=True)
            results.add(layer=name, threads=n, gops=row, peak_gops=peak, amx_peak_gops=amx_peaks.get(n))
        results.write(args.json)
        return 0
    layers = [] if args.e2e_only else resnet50_layers()
    if args.layers:
        layers = layers[: args.layers]
    with tempfile.TemporaryDirectory(prefix="bench_int8_") as log_dir:
        for layer in layers:
            c, h, w, o, k, stride, pad = layer
            rows = bench_conv(layer, args.threads, args.trials, log_dir, args.rounds)
            report(f"conv {k}x{k} {c}->{o} {h}x{w} s{stride}", rows, peaks)
            results.add(layer=f"conv {k}x{k} {c}->{o} {h}x{w} s{stride}", shape=list(layer),
                        gops_by_threads={n: row for n, row in rows})
        if not args.e2e_only:
            rows = bench_dense(1, 2048, 1000, args.threads, args.trials, log_dir, args.rounds)
            report("dense 2048->1000", rows, peaks)
            results.add(layer="dense 2048->1000", gops_by_threads={n: row for n, row in rows})
    if args.e2e or args.e2e_only:
        e2e = list(bench_e2e(args.threads, args.e2e_check, log=args.tuning_log, model=args.e2e_model,
                             rounds=max(args.rounds, 3)))
        for row in e2e:
            results.add(layer=f"end to end {row.pop('model')}", **row)
        # The docs' table (docs/benchmarks/dotprod.md), from the same rows as the JSON.
        print(timings_markdown(e2e, {"vs_ort_qdq": "vs ORT QDQ", "vs_openvino_qdq": "vs OpenVINO QDQ"}))
    results.settings["peak_gops"] = peaks
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
