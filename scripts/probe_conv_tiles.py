#!/usr/bin/env python
"""Which register tile of the int8 conv kernel is fastest on this CPU, layer by layer: a grid, in turns.

For each distinct 1x1 / 3x3 conv of ResNet-50 (``--layers`` picks some), the packed kernel with its
requantize epilogue -- what a network runs and what ``tuning.tune`` measures -- is built with the
fallback config and with every tile of ``tile_oc`` output-channel blocks x ``tile_oh`` x ``tile_ow`` pixels
whose accumulators fit the ISA's budget (``--max-acc``) and whose pixel count is in ``--pixels``; all of a
layer's builds are timed in turns (``--rounds``), on cached operands. A row is each tile's GOPS and its time
over the fallback's (below 1: faster), with the 95 % bootstrap interval.

The fallback tile is a choice made on one CPU; this says whether another CPU would choose another.

    PYTHONPATH=. python scripts/probe_conv_tiles.py --rounds 5 --json docs/benchmarks/data/probe_conv_tiles.json
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402,F401  (registers the templates)
from tvm_tcutils._tvm import host_target, tvm  # noqa: E402
from tvm import autotvm, te  # noqa: E402
from tvm.autotvm.env import GLOBAL_SCOPE  # noqa: E402
from tvm_tcutils.bench.competitors import compare, ratios, te_function  # noqa: E402
from tvm_tcutils.bench.int8 import resnet50_layers  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.dotprod.isa import for_target  # noqa: E402
from tvm_tcutils.dotprod.strategy import CONV2D_NCHW_TASK  # noqa: E402
from tvm_tcutils.tuning import valid_indexes  # noqa: E402


def _instantiate(task, cfg):
    """The packed op with its epilogue (what a tuner measures) under ``cfg``: (function, arguments)."""
    old, GLOBAL_SCOPE.in_tuning = GLOBAL_SCOPE.in_tuning, True
    try:
        with task.target:
            sched, args = task.instantiate(cfg)
    finally:
        GLOBAL_SCOPE.in_tuning = old
    return tvm.build(sched, args, target=task.target), args


def _candidates(task, pixels, max_acc):
    """``{(tile_oc, tile_oh, tile_ow): config}`` of the tiles in the grid (unroll_kw off, par_depth 3)."""
    space, out = task.config_space, {}
    for index in valid_indexes(space):
        cfg = space.get(index)
        tile = (cfg["tile_oc"].val, cfg["tile_oh"].val, cfg["tile_ow"].val)
        if cfg["unroll_kw"].val or cfg["par_depth"].val != 3 or tile in out:
            continue
        if tile[1] * tile[2] in pixels and tile[0] * tile[1] * tile[2] <= max_acc:
            out[tile] = cfg
    return out


def _fallback_tile(task):
    cfg = autotvm.task.space.FallbackConfigEntity()
    with task.target:
        task.instantiate(cfg)
    return cfg["tile_oc"].val, cfg["tile_oh"].val, cfg["tile_ow"].val


def _buffers(args, rng):
    return [tvm.nd.array(rng.integers(0, 100, [int(d) for d in a.shape]).astype(a.dtype)) for a in args]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=None,
                        help="indices into ResNet-50's distinct layers (default: all)")
    parser.add_argument("--pixels", type=int, nargs="+", default=[4, 6, 7, 8, 12, 14])
    parser.add_argument("--max-acc", type=int, default=24, help="most accumulators a tile may use")
    parser.add_argument("--rounds", type=int, default=5)
    add_json_argument(parser, "probe_conv_tiles")
    args = parser.parse_args(argv)
    target = tvm.target.Target(host_target())
    isa = for_target(target)
    layers = resnet50_layers()
    picked = range(len(layers)) if args.layers is None else args.layers
    results = Results("probe_conv_tiles", argv, target=str(target), isa=isa.name, rounds=args.rounds)
    rng = np.random.default_rng(0)
    for index in picked:
        c, h, w, o, k, stride, pad = layers[index]
        task = autotvm.task.create(CONV2D_NCHW_TASK, args=(
            te.placeholder((1, c, h, w), "uint8"), te.placeholder((o, c, k, k), "int8"),
            (stride, stride), (pad, pad, pad, pad), (1, 1), "int32"), target=target)
        fallback = _fallback_tile(task)
        grid = _candidates(task, set(args.pixels), args.max_acc)
        grid.pop(fallback, None)
        builds = {"fallback": _instantiate(task, autotvm.task.space.FallbackConfigEntity())}
        builds.update({"x".join(map(str, tile)): _instantiate(task, cfg) for tile, cfg in grid.items()})
        timers = {}
        for name, (func, tensors) in builds.items():
            timers[name] = te_function(func, _buffers(tensors, rng), repeat=3, min_repeat_ms=50)
        timed = compare(timers, args.rounds)
        rel = ratios(timed, "fallback")
        h_o, w_o = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        gop = 2 * c * o * k * k * h_o * w_o / 1e9
        label = f"{k}x{k} {c}->{o} {h}x{w} s{stride}"
        best = min(timed, key=lambda n: timed[n].median_ms)
        print(f"{label}: fallback {'x'.join(map(str, fallback))} "
              f"{gop / timed['fallback'].median_ms * 1e3:.0f} GOPS; best {best} "
              f"{gop / timed[best].median_ms * 1e3:.0f} GOPS x{rel[best].value:.3f} "
              f"[{rel[best].low:.3f}, {rel[best].high:.3f}]", flush=True)
        results.add(layer=label, fallback_tile=list(fallback), tiles={
            name: {"gops": gop / timed[name].median_ms * 1e3, **rel[name].as_dict()} for name in timed})
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
