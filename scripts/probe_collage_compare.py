#!/usr/bin/env python
"""Collage's final comparison alone, in a fresh process, on one ONNX file: the runtimes on the file and
the given toolchains alone, timed in interleaved rounds exactly as ``tvm-tcutils collage`` times them
(``collage.validate.final_comparison`` with its in-process sampler).

The evidence for docs/benchmarks/collage.md's note on onnxruntime inside a whole Collage run: run
beside the run's report, it shows whether a competitor's time depends on the search run before it.

    TVM_NUM_THREADS=1 PYTHONPATH=. python scripts/probe_collage_compare.py model-qdq.onnx tvm,ort,openvino \
        --alone tvm,ort,openvino
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an ONNX file with fixed input shapes")
    parser.add_argument("toolchains", help="toolchains whose runtimes run the file (e.g. tvm,ort,openvino)")
    parser.add_argument("--alone", default="", help="toolchains also timed alone on the package's import")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.model):
        raise SystemExit(f"model {args.model!r}: no such file")
    import onnx

    from tvm_tcutils._tvm import tvm  # noqa: F401  (TVM checked first)
    from tvm import relay

    from tvm_tcutils.collage import driver, validate
    from tvm_tcutils.collage.toolchains import resolve

    model = onnx.load(args.model)
    initializers = {init.name for init in model.graph.initializer}
    shapes = {value.name: [d.dim_value for d in value.type.tensor_type.shape.dim]
              for value in model.graph.input if value.name not in initializers}
    mod, params = relay.frontend.from_onnx(model, shapes)
    prepared = driver.prepare(mod, params)
    chains = resolve(args.toolchains)
    modules = driver.original_modules(prepared, args.model, chains)
    alone = [c for c in chains if c.name in args.alone.split(",")]
    modules.update(driver.single_toolchain_modules(prepared, alone))
    start = time.time()
    final = validate.final_comparison(modules, None, None, 0.95, None, min_rounds=args.rounds,
                                      max_rounds=args.rounds)
    print(f"final comparison of {', '.join(modules)} in {time.time() - start:.0f} s (builds included)")
    for name, timing in final.timings.items():
        samples = sorted(timing.samples_ms)
        listed = ", ".join(f"{v:.2f}" for v in timing.samples_ms)
        print(f"  {name:22s} median {samples[len(samples) // 2]:8.3f} ms  samples {listed}")
    print(f"answer: {final.answer} ({final.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
