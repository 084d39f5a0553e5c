#!/usr/bin/env python
"""Which operators of a model each Collage toolchain cannot take: the coverage table of docs/benchmarks/collage.md.

For each model (an onnx light model as ``light_<name>``, a zoo name, or an .onnx file), the operators none
of a toolchain's candidates contains (``collage.driver.unreachable_ops``: what keeps it from a region and
its ``alone`` line from the whole model), with counts and why: no ONNX converter in the package's export,
a converter that does not take these calls (layout, dtype, attributes), or a runtime that does not run it.
No timing: candidates are enumerated, nothing is built.

    PYTHONPATH=. python scripts/collage_coverage.py --models light_inception_v1 light_resnet50 resnet-50-onnx \\
        --toolchains tvm,ort,openvino --json docs/benchmarks/data/collage_coverage.json
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402


def _why(toolchain: str, op: str) -> str:
    from tvm_tcutils.collage.toolchains import openvino, relay_to_onnx

    if toolchain in ("ort", "openvino", "openvino-bf16"):
        if op not in relay_to_onnx.CONVERTERS:
            return "no ONNX converter"
        if toolchain.startswith("openvino") and op in openvino.NOT_RUN:
            return "OpenVINO does not run it"
        return "its converter does not take these calls"
    return "no pattern claims it"


def _path(name: str) -> str:
    if name.startswith("light_"):
        from tvm_tcutils.bench.models import light_model

        return light_model(name[len("light_"):])
    return name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True, help="light_<name>, zoo names or .onnx files")
    parser.add_argument("--toolchains", default="tvm,ort,openvino", help="comma-separated toolchain names")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)

    import tvm_tcutils
    from tvm_tcutils.collage.candidates import enumerate_candidates
    from tvm_tcutils.collage.driver import prepare, unreachable_ops
    from tvm_tcutils.collage.subgraph import IndexedGraph
    from tvm_tcutils.collage.toolchains import resolve

    toolchains = resolve(args.toolchains)
    results = Results(__file__, argv, toolchains=[tc.name for tc in toolchains])
    print("| model | operators | toolchain | operators it cannot take (TVM runs them) |")
    print("|---|---|---|---|")
    for name in args.models:
        mod, params = tvm_tcutils.load_model(_path(name))
        graph = IndexedGraph(prepare(mod, params)["main"])
        calls = sum(1 for node in graph.nodes if node.kind == "call")
        missing = unreachable_ops(graph, enumerate_candidates(graph, toolchains), toolchains)
        for tc in toolchains:
            if tc.is_tvm:
                continue
            ops = missing.get(tc.name, {})
            cell = "; ".join(f"`{op}` x{count} ({_why(tc.name, op)})" for op, count in ops.items()) or "none"
            print(f"| {name} | {calls} | {tc.name} | {cell} |")
            results.add(model=name, calls=calls, toolchain=tc.name, unreachable=ops,
                        why={op: _why(tc.name, op) for op in ops})
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
