#!/usr/bin/env python
"""How much of an isolated TVM Collage candidate's time is layout transforms at its boundary.

Collage measures each candidate alone. Built alone, a TVM conv candidate gets
``AlterOpLayout``'s NCHW->NCHWc transform of its input and NCHWc->NCHW of its
output; in a whole TVM region, consecutive convs stay in NCHWc and those
transforms disappear. This script collects the single-conv TVM candidates of
a model (``CustomCostEstimator``, no measurement), builds a spread of
``--count`` of them for the host CPU, profiles each with TVM's debug executor
and prints the share of ``layout_transform`` kernels (also written as JSON,
``--json``; the harness is ``tvm_tcutils.bench.collage``).

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/diag_isolated_tvm_costs.py mobilenet-v2-onnx
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402
from tvm_tcutils.bench.collage import kernel_profile_us, single_conv_tvm_candidates  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a tvm_tcutils.load_model name or file")
    parser.add_argument("--count", type=int, default=12, help="candidates to profile, spread over the model")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    mod, params = tvm_tcutils.load_model(args.model)
    candidates = single_conv_tvm_candidates(mod, params)
    if not candidates:
        raise SystemExit(f"{args.model}: no single-conv TVM candidates")
    picked = candidates[:: max(1, len(candidates) // args.count)][: args.count]
    print(f"{args.model}: {len(candidates)} single-conv TVM candidates, profiling {len(picked)}")
    results = Results(__file__, argv, model=args.model, candidates=len(candidates))
    total = transforms = 0.0
    for candidate in picked:
        kernels = kernel_profile_us(candidate)
        spent = sum(kernels.values())
        moved = sum(us for name, us in kernels.items() if "layout_transform" in name)
        total, transforms = total + spent, transforms + moved
        results.add(total_us=spent, layout_transform_us=moved, kernels_us=kernels)
        print(f"{spent:9.1f} us, layout_transform {moved:8.1f} us  ({', '.join(sorted(kernels))})")
    print(f"layout_transform share of these candidates' time: {transforms / total:.2f}")
    results.settings["layout_transform_share"] = transforms / total
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
