#!/usr/bin/env python
"""Collage search speed on a generated encoder (synthetic costs, no measuring).

Builds an N-layer transformer encoder in Relay (decomposed layer norm and GELU,
so that 24 layers hold over 2,000 operators), enumerates every candidate of
three toolchains (TVM's fusion groups, a graph-style "ort"-like toolchain that
claims every operator and combines neighbours, a library-style "blas"-like
toolchain for dense/batch_matmul), gives them deterministic synthetic costs
and times the search alone (the issue's target: under 1 s) and the
enumeration. It runs the 24-layer encoder and, when that has fewer than
``--min-ops`` operators, a deeper one that has at least that many.

Peer: TVM 0.19's own CollagePartition (C++) partitions a smaller encoder
(``--peer-layers``) for TVM plus ``example_target_hook`` (the only BYOC target
kind registered in this build) with the same Python cost function as ours;
the script prints both wall times, their ratio and both total costs.

    PYTHONPATH=. python scripts/bench_collage_search.py --layers 24

With ``--cnn inception_v3`` (any model name of ``tvm_tcutils.models``) it
also searches that model's candidates for the real toolchains (tvm, ort,
blas) with roofline-style synthetic costs (per toolchain: a call overhead,
FLOPs at a rate per op kind, and the bytes crossing the candidate's boundary,
so that fused groups cost less than their nodes alone, as measured costs do),
once with the A* bound from the linear relaxation and once with the
coordinate-ascent bound alone (installs without scipy), and prints both
search times, states and each bound at the start as a fraction of the
optimum.

The numbers are also written as JSON (``--json``, default
``docs/benchmarks/data/bench_collage_search.json``). The harness lives in
``tvm_tcutils.bench.collage``.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench import collage as bench  # noqa: E402
from tvm_tcutils.bench.collage import mock_toolchains, roofline_costs, synthetic_costs  # noqa: E402,F401
from tvm_tcutils.bench.models import encoder, operator_count  # noqa: E402,F401  (old import path of tests)
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--min-ops", type=int, default=2000,
                        help="add layers until the encoder has at least this many operators")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer-layers", type=int, default=2,
                        help="encoder layers for the comparison with TVM's CollagePartition (0: skip)")
    parser.add_argument("--cnn", default="",
                        help="also search this model's candidates with roofline-style costs (e.g. inception_v3)")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    results = Results(__file__, argv)
    if args.cnn:
        row = bench.model_search(args.cnn)
        results.add(kind="model", **row)
        print(f"{args.cnn}: {row['nodes']} nodes, {row['candidates']} candidates (tvm, ort, blas); "
              f"enumeration {row['enumerate_s']:.2f} s")
        for label, b in row["bounds"].items():
            print(f"  bound {label}: search {b['search_s']:.2f} s, {b['states']} states, cost {b['cost_ms']:.3f} ms, "
                  f"bound at start {b['bound_share']:.3f} of it")
        print(f"  same optimum with both bounds: {'yes' if row['same_optimum'] else 'NO'}")
    if args.peer_layers:
        p = bench.peer_search(args.peer_layers)
        results.add(kind="peer", **p)
        print(f"peer (encoder {p['layers']} layers, {p['operators']} operators, max depth {p['depth']}, "
              f"same cost function): ours {p['ours_s']:.2f} s, TVM 0.19 CollagePartition {p['tvm_s']:.2f} s "
              f"(TVM/ours {p['tvm_over_ours']:.2f}x); total cost ours {p['ours_cost_ms']:.3f} ms, "
              f"TVM {p['tvm_cost_ms']:.3f} ms")
    for layers in sorted({args.layers, bench.layers_for(args.min_ops, args.layers)}):
        r = bench.encoder_search(layers, args.repeat)
        results.add(kind="encoder", **r)
        print(f"encoder: {r['layers']} layers, {r['nodes']} nodes, {r['operators']} operators")
        print(f"candidates: {r['candidates']} "
              f"({', '.join(f'{k} {v}' for k, v in r['candidates_per_toolchain'].items())}); "
              f"enumeration {r['enumerate_s']:.2f} s")
        print(f"search: {r['search_s']:.3f} s (median of {args.repeat}), {r['states']} states expanded, "
              f"{r['partitions']} partitions; target < 1 s: {'OK' if r['search_s'] < 1.0 else 'MISSED'}")
        print(f"estimated cost: collage {r['cost_ms']:.3f} ms, tvm alone {r['tvm_alone_cost_ms']:.3f} ms "
              f"(ratio {r['cost_ratio']:.3f})")
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
