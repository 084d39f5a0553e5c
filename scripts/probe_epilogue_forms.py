#!/usr/bin/env python
"""Which epilogue forms the int8 kernels should use on this CPU: whole models, in turns.

The evidence behind ``tvm_tcutils.dotprod.rounding``'s choices and ``dotprod.tile_epilogue``. Each zoo
model's onnxruntime-quantized QDQ file is built for ``host_target()`` once per variant (``--variants``,
all eight by default), differing only in the rewrites of the final TIR:

* ``vnni-only``: ``llvm.nearbyint`` in the VNNI kernels only, 8-bit results with the 128-shifted
  constant, each tile conv's epilogue after its whole tile program (the package before these rewrites);
* ``nearbyint``: also in the tile (AMX) kernels;
* ``narrowed``: also :func:`~tvm_tcutils.dotprod.rounding.narrow_directly` where the target has a tile
  engine;
* ``moved``: also each tile conv's epilogue step by step inside its program
  (:func:`tvm_tcutils.dotprod.tile_epilogue.interleave`);
* ``biased``: also each step's accumulators starting from the bias
  (:func:`tvm_tcutils.dotprod.tile_epilogue.bias_into_tiles`);
* ``package``: what the package does now (also runs of 8-bit vectors narrowed by the saturating packs,
  :func:`tvm_tcutils.dotprod.rounding.narrow_by_packs`);
* ``direct-avx512`` / ``packs-avx512``: the package with the tile targets' direct narrowing (and packs) on
  every AVX-512BW target (:func:`tvm_tcutils.dotprod.rounding.narrowing`), to measure them on CPUs without
  tiles (``packs-avx512`` is the package's own rule since session 58);
* ``tiles-only``: the package with session 57's rule, the direct narrowing and the packs on tile targets
  only (the variants above ``package`` keep that rule too);
* ``packs-only``: the packs on every AVX-512BW target, the direct narrowing on tile targets only (a loop's
  odd last vector then keeps the 128-shifted form instead of ``vpmovdb`` to memory).

All must give bit-identical outputs (checked first); then they are timed in turns in one process at one
thread (``--rounds``), each a median of runs, and each is divided by the first variant with a bootstrap
interval (below 1: faster). On a CPU without a tile engine they build the same code. Four builds in one
process share its caches and allocator: on Emerald Rapids this probe said x0.935 for moving the non-flat
convs' epilogues where the same builds in processes of their own, in turns, gave x0.98 -- confirm a
decision with isolated processes (docs/benchmarks/dotprod.md, 2026-12-06).

    PYTHONPATH=. python scripts/probe_epilogue_forms.py --isolated --models resnet-50-onnx resnet-18-onnx \
        --rounds 15 --json docs/benchmarks/data/probe_epilogue_forms.json
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

os.environ["TVM_NUM_THREADS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402,F401  (installs the hooks)
from tvm_tcutils._tvm import target_has, tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib import graph_executor  # noqa: E402
from tvm_tcutils.bench.competitors import compare, python_call, ratios  # noqa: E402
from tvm_tcutils.bench.int8_models import feed_of, model_files  # noqa: E402
from tvm_tcutils.bench.isolated import Isolated  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.dotprod import rounding, tile_epilogue  # noqa: E402
from tvm_tcutils.dotprod.isa import tile_isa  # noqa: E402

VARIANTS = ("vnni-only", "nearbyint", "narrowed", "moved", "biased", "package", "direct-avx512", "packs-avx512",
            "tiles-only", "packs-only")


def _avx512bw(target) -> bool:
    return target is not None and target_has(tvm.target.Target(target), "avx512bw")


def _tiles_only(target) -> tuple:
    """Session 57's :func:`rounding.narrowing`: the direct narrowing and the packs on tile targets only."""
    tiles = target is not None and tile_isa(tvm.target.Target(target)) is not None
    return tiles, tiles and _avx512bw(target)


@contextlib.contextmanager
def variant(name: str):
    """The rounding rewrites as ``name`` has them, for the builds inside."""
    saved = (rounding.MEASURED_ISAS, rounding.narrow_directly, rounding.narrow_by_packs,
             tile_epilogue.interleave_module, tile_epilogue.bias_into_tiles, rounding.narrowing)
    if name in ("direct-avx512", "packs-avx512"):  # the package, with the narrowing of tile targets on AVX-512BW ones
        rounding.narrowing = lambda target: (_avx512bw(target), name == "packs-avx512" and _avx512bw(target))
    elif name == "packs-only":  # the packs on AVX-512BW, the direct narrowing on tile targets only
        rounding.narrowing = lambda target: (_tiles_only(target)[0], _avx512bw(target))
    elif name != "package":  # the forms written before the AVX-512BW rule: tile targets only
        rounding.narrowing = _tiles_only
    if name not in ("package", "packs-avx512", "tiles-only", "packs-only"):
        rounding.narrow_by_packs = lambda func: (func, 0)
    if name in ("vnni-only", "nearbyint", "narrowed"):
        tile_epilogue.interleave_module = lambda mod: mod
    if name == "moved":
        tile_epilogue.bias_into_tiles = lambda func, lanes=16: (func, 0)
    if name in ("vnni-only", "nearbyint"):
        rounding.narrow_directly = lambda func: (func, 0)
    if name == "vnni-only":
        rounding.MEASURED_ISAS = frozenset({"x86_vnni"})
    try:
        yield
    finally:
        (rounding.MEASURED_ISAS, rounding.narrow_directly, rounding.narrow_by_packs,
         tile_epilogue.interleave_module, tile_epilogue.bias_into_tiles, rounding.narrowing) = saved


def built(path: str, feed, name: str, folder: str):
    """``(module with ``feed`` set, its exported library in ``folder``)`` of variant ``name``."""
    mod, params = tvm_tcutils.load_model(path)
    with variant(name), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm_tcutils.host_target(), params=params)
    library = os.path.join(folder, f"{name}.so")
    lib.export_library(library)
    module = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    module.set_input(**feed)
    return module, library


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet-50-onnx"], help="zoo names (their QDQ files)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of turns")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="forms to build (the first is the others' reference)")
    parser.add_argument("--isolated", action="store_true",
                        help="time each build in a process of its own (tvm_tcutils.bench.isolated), not in this one")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds must be >= 2, got {args.rounds}")
    if len(set(args.variants)) < 2:
        parser.error(f"--variants needs two different forms, got {args.variants}")
    names = list(dict.fromkeys(args.variants))
    results = Results(__file__, argv, rounds=args.rounds, threads=1, variants=names,
                      target=str(tvm_tcutils.host_target()), isolated=args.isolated)
    for model in args.models:
        path = model_files(model, ["qdq"])["qdq"]
        feed = feed_of(path)
        with tempfile.TemporaryDirectory(prefix="tcutils-forms-") as folder, contextlib.ExitStack() as workers:
            modules = {name: built(path, feed, name, folder) for name in names}
            outputs = {}
            for name, (module, _) in modules.items():
                module.run()
                outputs[name] = module.get_output(0).numpy()
            for name in names[1:]:
                if not np.array_equal(outputs[name], outputs[names[0]]):
                    raise SystemExit(f"{model}: {name} differs from {names[0]}: the rewrites changed values")
            if args.isolated:  # each stopped while another runs; none shares this process's caches
                timers = {name: workers.enter_context(Isolated("tvm", library, feed, threads=1, min_ms=100.0))
                          for name, (_, library) in modules.items()}
            else:
                timers = {name: python_call(module.run, repeat=5, min_ms=100.0)
                          for name, (module, _) in modules.items()}
            timings = compare(timers, rounds=args.rounds)
        for name, r in ratios(timings, names[0]).items():
            print(f"{model:18s} {name:10s} {timings[name].median_ms:7.3f} ms  vs {names[0]} {r}")
            results.add(model=model, variant=name, median_ms=timings[name].median_ms,
                        samples_ms=list(timings[name].samples_ms), ratio=r.value, low=r.low, high=r.high)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
