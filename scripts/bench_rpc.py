#!/usr/bin/env python
"""Measuring through TVM's RPC tracker: how the measuring phase scales with the number of servers.

Starts a local tracker and 1, 2 (and 4, where the machine has the cores)
``tvm_tcutils.rpc_server`` servers, each pinned to a core of its own, then in
interleaved rounds runs a measured Collage search (empty cost cache) and a
short AutoTVM tuning session through each set, and prints the wall times, the
speed-up over one server with its interval, and how the candidates' remote
costs agree with a local search's (remote / local).

The harness is ``tvm_tcutils.bench.rpc``; results also go to JSON (``--json``).

    PYTHONPATH=. python scripts/bench_rpc.py --model mlp --rounds 3
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402
from tvm_tcutils.bench import rpc as bench  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import aligned, cell  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="built-in model or file (default mlp)")
    parser.add_argument("--toolchains", default="tvm", help="Collage toolchains (default tvm)")
    parser.add_argument("--servers", default=None,
                        help="comma-separated server counts (default 1,2,4 where the machine has 4 cores, else 1,2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per candidate")
    parser.add_argument("--trials", type=int, default=4, help="tuning trials per task")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.servers.split(",")] if args.servers else (
        [1, 2, 4] if (os.cpu_count() or 1) >= 4 else [1, 2])
    if args.rounds < 1 or any(n < 1 for n in counts):
        parser.error("--rounds and every server count must be at least 1")
    mod, params = tvm_tcutils.load_model(args.model)
    target = tvm_tcutils.host_target()
    rows = bench.scaling(counts, mod, params, args.toolchains.split(","), target, args.rounds, args.repeat,
                         args.trials)
    results = Results(__file__, argv, model=args.model, toolchains=args.toolchains, rounds=args.rounds,
                      repeat=args.repeat, trials=args.trials, target=target)
    table = []
    for row in rows:
        results.add(**row)
        agree = row["cost_agreement"]
        table.append([row["servers"], cell(row["collage"].median_ms / 1e3), str(row["collage_speedup"]),
                      cell(row["tune"].median_ms / 1e3), str(row["tune_speedup"]),
                      f"{agree['median']:.2f} [{agree['min']:.2f}, {agree['max']:.2f}]"])
    print(aligned(["servers", "collage s", "speed-up vs first", "tune s", "speed-up vs first",
                   "remote/local cost"], table))
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
