#!/usr/bin/env python
"""How much of an isolated TVM Collage candidate's time is layout transforms at its boundary.

Collage measures each candidate alone. Built alone, a TVM conv candidate gets
``AlterOpLayout``'s NCHW->NCHWc transform of its input and NCHWc->NCHW of its
output; in a whole TVM region, consecutive convs stay in NCHWc and those
transforms disappear. This script collects the single-conv TVM candidates of
a model (``CustomCostEstimator``, no measurement), builds a spread of
``--count`` of them for the host CPU, profiles each with TVM's debug executor
and prints the share of ``layout_transform`` kernels.

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/diag_isolated_tvm_costs.py mobilenet-v2-onnx
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib.debugger import debug_executor  # noqa: E402

import tvm_tcutils  # noqa: E402
from tvm_tcutils import collage  # noqa: E402
from tvm_tcutils.collage.cost.custom import CustomCostEstimator  # noqa: E402
from tvm_tcutils.models import random_inputs  # noqa: E402


def single_conv_tvm_candidates(mod, params) -> list:
    """Stand-alone modules of the model's TVM candidates that hold exactly one ``nn.conv2d``."""
    found = []

    def collect(candidate, toolchain):
        name = getattr(toolchain, "name", toolchain)
        if name == "tvm" and candidate.astext(show_meta_data=False).count("nn.conv2d(") == 1:
            found.append(candidate)
        return 1.0

    collage.partition(mod, params, toolchains="tvm", cost_estimator=CustomCostEstimator(collect),
                      validate_rounds=0, compare_single=False)
    return found


def profile_us(mod) -> dict:
    """Per-kernel microseconds of one run of ``mod`` (debug executor)."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm_tcutils.host_target())
    with tempfile.TemporaryDirectory() as dump:
        run = debug_executor.GraphModuleDebug(lib["debug_create"]("default", tvm.cpu()), [tvm.cpu()],
                                              lib.get_graph_json(), dump_root=dump)
        run.set_input(**random_inputs(mod))
        report = run.profile()
    out: dict = {}
    for call in report.calls:
        name = str(call["Name"])
        out[name] = out.get(name, 0.0) + call["Duration (us)"].microseconds
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a tvm_tcutils.load_model name or file")
    parser.add_argument("--count", type=int, default=12, help="candidates to profile, spread over the model")
    args = parser.parse_args(argv)
    mod, params = tvm_tcutils.load_model(args.model)
    candidates = single_conv_tvm_candidates(mod, params)
    if not candidates:
        raise SystemExit(f"{args.model}: no single-conv TVM candidates")
    picked = candidates[:: max(1, len(candidates) // args.count)][: args.count]
    print(f"{args.model}: {len(candidates)} single-conv TVM candidates, profiling {len(picked)}")
    total = transforms = 0.0
    for candidate in picked:
        kernels = profile_us(candidate)
        spent = sum(kernels.values())
        moved = sum(us for name, us in kernels.items() if "layout_transform" in name)
        total, transforms = total + spent, transforms + moved
        print(f"{spent:9.1f} us, layout_transform {moved:8.1f} us  ({', '.join(sorted(kernels))})")
    print(f"layout_transform share of these candidates' time: {transforms / total:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
