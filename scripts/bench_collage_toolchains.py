#!/usr/bin/env python
"""Per-operator-kind latency of the Collage toolchains: TVM, FastMath, ORT, BLAS and OpenVINO, in one run.

Each kind is one small Relay function at the shapes of the issue's models
(BERT-like encoder: 128 tokens, hidden 256, 4 heads; ResNet-50's 3x3 conv),
with He-style weights and normal inputs. It is built each way below and timed
side by side in this process:

* ``tvm``: TVM alone (``relay.build``, opt_level 3, llvm for this CPU);
* ``fastmath``: the same after TVM's ``FastMath`` rewrite (the Collage
  toolchain ``tvm-fastmath``: fast erf, exp, tanh, softmax);
* ``ort``: the whole function partitioned to ``tcutils_ort`` (ONNX through the
  package's packed-function call, as Collage would run it);
* ``blas``: the matrix products partitioned to ``tcutils_blas`` (numpy's
  OpenBLAS), for the kinds that have one;
* ``openvino`` / ``ov-bf16``: the whole function partitioned to OpenVINO's CPU
  runtime in f32 / bf16 (``openvino.partition_for``); each is left out, with
  a note, where OpenVINO is not installed or the CPU has no native bf16;
* ``ort-direct``: the same ONNX model run by onnxruntime from Python with an
  IOBinding, to show what the packed-function hop costs.

Variants are timed round-robin (the median of 5 runs each per round after a
warm-up and a 20 ms pause, median over rounds; ``tvm_tcutils.measure``)
so that changes in machine load hit all of them alike. Ratios are
toolchain / tvm (below 1 = faster than TVM).

With ``--models``, whole models instead: TVM alone, with FastMath, the greedy
BYOC partition of each single toolchain (ORT, BLAS, OpenVINO f32 and bf16:
every region it claims), and onnxruntime on the original ONNX graph for the
ONNX-built models (outputs are checked against TVM alone). ``--singles``
picks the toolchains next to TVM.

The harness is ``tvm_tcutils.bench.toolchains``; results also go to JSON (``--json``).

Usage::

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_collage_toolchains.py [--repeat 30] [--kinds dense,softmax]
    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_collage_toolchains.py --models bert-tiny-onnx,resnet-18
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402

import tvm_tcutils  # noqa: E402,F401  (registers the toolchains)
from tvm_tcutils.bench import toolchains as bench  # noqa: E402
from tvm_tcutils.bench.competitors import add_timing_arguments, compare, ratios, use_timing_arguments  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument, jsonable  # noqa: E402
from tvm_tcutils.bench.table import columns_markdown  # noqa: E402
from tvm_tcutils.collage.toolchains import blas, openvino, ort  # noqa: E402

KINDS = bench.Kinds.NAMES


def _cells(timed, columns, width=13) -> str:
    """Each column's median ms, then its ratio to TVM alone ('-' where it was not timed)."""
    tvm_ms = timed["tvm"].median_ms
    ms = [timed[c].median_ms if c in timed and timed[c].samples_ms else None for c in columns]
    return "".join(f"{'-' if m is None else f'{m:.3f}':>{width}}" for m in ms) + "".join(
        f"{'-' if m is None else f'{m / tvm_ms:.2f}':>{width}}" for m in ms[1:])


def _header(first: str, columns, width=13) -> str:
    return f"{first:<20}" + "".join(f"{c + ' ms':>{width}}" for c in columns) + "".join(
        f"{c + '/tvm':>{width}}" for c in columns[1:])


def _bench_models(names, repeat, results, singles) -> None:
    columns = ["tvm", "fastmath", *singles] + (["direct"] if "ort" in singles else [])
    print(_header("model", columns) + "  partitions")
    for name in names:
        timers, counts = bench.model_timers(name, singles)
        timed = compare(timers, repeat)
        print(f"{name:<20}{_cells(timed, columns)}  {counts}", flush=True)
        results.add(model=name, timings=timed, over_tvm=ratios(timed, "tvm"), partitions=counts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="rounds; each times 5 runs of every variant")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {list(KINDS)}")
    parser.add_argument("--models", default="", help="comma-separated model names: benchmark whole models instead")
    parser.add_argument("--singles", default=",".join(bench.SINGLES),
                        help=f"toolchains next to TVM and TVM FastMath, of {list(bench.SINGLES)} "
                             "(each left out with a note where it is not usable here)")
    add_json_argument(parser, __file__)
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    use_timing_arguments(args)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    wanted = [c for c in args.singles.split(",") if c]
    unknown = sorted(set(wanted) - set(bench.SINGLES))
    if unknown:
        parser.error(f"--singles: unknown {unknown}; choose from {list(bench.SINGLES)}")
    singles, notes = bench.usable_singles(wanted)
    results = Results(__file__, argv, rounds=args.repeat, singles=singles, left_out=notes,
                      tvm_num_threads=os.environ.get("TVM_NUM_THREADS", "unset"))
    print(f"tvm {tvm.__version__}, {ort.available()[1]}, {blas.available()[1]}, "
          f"{openvino.available('f32')[1]}, TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}, "
          f"target={tvm_tcutils.host_target()}")
    for note in notes:
        print(f"note: {note}")
    if args.models:
        _bench_models([m for m in args.models.split(",") if m], args.repeat, results, singles)
        results.write(args.json)
        return 0
    columns = ["tvm", "fastmath", *singles] + (["direct"] if "ort" in singles else [])
    header = _header("kind", columns)
    print(header)
    print("-" * len(header))
    builder = bench.Kinds()
    for kind in kinds:
        timed = compare(bench.kind_timers(kind, builder, singles), args.repeat)
        results.add(kind=kind, timings=timed, over_tvm=ratios(timed, "tvm"))
        print(f"{kind:<20}{_cells(timed, columns)}", flush=True)
    results.write(args.json)
    # The docs' table (docs/benchmarks/collage.md), from the same rows as the JSON.
    print(columns_markdown(jsonable(results.payload())["rows"], "kind", "over_tvm", "tvm"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
