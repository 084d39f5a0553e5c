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

Variants are timed round-robin (the median of 5 runs each per round after a
warm-up and a 20 ms pause, median over rounds; ``tvm_tcutils.measure``)
so that changes in machine load hit all of them alike. Ratios are
toolchain / tvm (below 1 = faster than TVM).

With ``--models``, whole models instead: TVM alone, the greedy BYOC
partition to ``tcutils_ort`` (every convertible region), and onnxruntime on
the original ONNX graph for the ONNX-built models (outputs are checked
against TVM alone).

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
from tvm_tcutils.bench.competitors import compare, ratios  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.collage.toolchains import blas, ort  # noqa: E402

KINDS = bench.Kinds.NAMES


def _bench_models(names, repeat, results) -> None:
    print(f"{'model':<20}{'tvm ms':>9}{'ort-byoc':>10}{'onnx-ort':>10}{'byoc/tvm':>10}{'onnx/tvm':>10}  partitions")
    for name in names:
        timers, count = bench.model_timers(name)
        timed = compare(timers, repeat)
        ms = {k: t.median_ms for k, t in timed.items()}
        onnx_ms = ms.get("onnx")
        onnx_cells = (f"{onnx_ms:>10.2f}{onnx_ms / ms['tvm']:>10.2f}" if onnx_ms else f"{'-':>10}" * 2)
        print(f"{name:<20}{ms['tvm']:>9.2f}{ms['byoc']:>10.2f}{onnx_cells[:10]}{ms['byoc'] / ms['tvm']:>10.2f}"
              f"{onnx_cells[10:]}  {count}", flush=True)
        results.add(model=name, timings=timed, over_tvm=ratios(timed, "tvm"), partitions=count)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="rounds; each times 5 runs of every variant")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {list(KINDS)}")
    parser.add_argument("--models", default="", help="comma-separated model names: benchmark whole models instead")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    results = Results(__file__, argv, rounds=args.repeat,
                      tvm_num_threads=os.environ.get("TVM_NUM_THREADS", "unset"))
    if args.models:
        threads = os.environ.get('TVM_NUM_THREADS', 'unset')
        print(f"tvm {tvm.__version__}, {ort.available()[1]}, TVM_NUM_THREADS={threads}")
        _bench_models([m for m in args.models.split(",") if m], args.repeat, results)
        results.write(args.json)
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
    builder = bench.Kinds()
    for kind in kinds:
        timed = compare(bench.kind_timers(kind, builder, ok), args.repeat)
        results.add(kind=kind, timings=timed, over_tvm=ratios(timed, "tvm"))
        cells = {"ort": None, "blas": None, "direct": None}
        cells.update({name: t.median_ms for name, t in timed.items()})
        tvm_ms = cells["tvm"]

        def fmt(value, width, ratio=False):
            if value is None:
                return f"{'-':>{width}}"
            return f"{value / tvm_ms:>{width}.2f}" if ratio else f"{value:>{width}.3f}"

        print(f"{kind:<13}{tvm_ms:>9.3f}{fmt(cells['fastmath'], 9)}{fmt(cells['ort'], 9)}{fmt(cells['blas'], 9)}"
              f"{fmt(cells['direct'], 11)}"
              f"{fmt(cells['ort'], 9, True)}{fmt(cells['blas'], 9, True)}", flush=True)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
