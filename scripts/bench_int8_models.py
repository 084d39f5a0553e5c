"""Quantized models end to end: tvm-tcutils (plain relay.build) against onnxruntime and OpenVINO, isolated.

Each model is quantized by onnxruntime's quantizer (``quantize_static`` QDQ
per-channel and ``quantize_dynamic``; cached under ``~/.cache/tvm-tcutils/int8``)
and run by the three runtimes, each contender in a process of its own that is
stopped (``SIGSTOP``) while another one is timed, so no runtime's spinning
threads take the cores of the next (``tvm_tcutils.bench.isolated``). The
contenders of one thread count take turns, ``--rounds`` rounds; ratios carry
bootstrap intervals. See ``tvm_tcutils.bench.int8_models``.

Usage::

    PYTHONPATH=. python scripts/bench_int8_models.py --models bert-tiny-onnx bert-base-onnx --threads 1 2
    PYTHONPATH=. python scripts/bench_int8_models.py --models resnet-50-onnx mobilenet-v2-onnx --routes qdq fp32
    PYTHONPATH=. python scripts/bench_int8_models.py --models light_inception_v1 light_shufflenet --routes qdq

``light_<name>``: one of the onnx package's light models with random weights
(``tvm_tcutils.bench.models.light_model``); an ``.onnx`` file is prepared as onnxruntime's
quantization guide has users do (``quant_pre_process``) before it is quantized.

The rows go to ``docs/benchmarks/data/bench_int8_models.json`` (``--json``), with the command, the
machine and the date; ``docs/benchmarks/dotprod.md``'s model tables are made from that file.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402,F401  (installs the hooks)
from tvm_tcutils.bench.competitors import add_timing_arguments, use_timing_arguments  # noqa: E402
from tvm_tcutils.bench.int8 import is_quantized  # noqa: E402
from tvm_tcutils.bench.int8_models import DEFAULT_ROUTES, ROUTES, RUNTIMES, bench_model, markdown  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.models import light_model_names  # noqa: E402
from tvm_tcutils.dotprod.isa import for_target  # noqa: E402
from tvm_tcutils.models import ONNX_BUILDERS  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert-tiny-onnx"],
                        help="built-in ONNX models (%s), .onnx files, or light_<name>: an onnx package light "
                        "model with random weights (default: bert-tiny-onnx)" % ", ".join(ONNX_BUILDERS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7, help="turns per contender (median)")
    parser.add_argument("--routes", nargs="+", default=list(DEFAULT_ROUTES), choices=list(ROUTES),
                        help="qdq-rr: 7-bit weights, as onnxruntime advises on CPUs without VNNI "
                        f"(default: {' '.join(DEFAULT_ROUTES)})")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES))
    add_json_argument(parser, __file__)
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    use_timing_arguments(args)
    if any(n < 1 for n in args.threads):
        parser.error(f"--threads must be >= 1, got {args.threads}")
    lights = ["light_" + name for name in light_model_names()]
    for model in args.models:
        if not (model in ONNX_BUILDERS or model in lights or (model.endswith(".onnx") and os.path.isfile(model))):
            parser.error(f"--models {model!r}: not an .onnx file here, nor one of {', '.join(ONNX_BUILDERS)}, "
                         f"{', '.join(lights)}")
        if is_quantized(model):
            parser.error(f"--models {model!r}: already quantized; give its float model (it is quantized here)")
    target = tvm_tcutils.host_target()
    isa = for_target(target)
    print(f"target {target}: ISA {isa.name if isa else 'none (the float path)'}; each contender in its own "
          f"process, stopped while another runs")
    results = Results(__file__, argv, target=target, isa=isa.name if isa else None, threads=args.threads,
                      rounds=args.rounds, routes=args.routes, isolation="one process per contender, SIGSTOP "
                      "while another is timed")
    rows = []
    for model in args.models:
        for row in bench_model(model, args.threads, args.rounds, args.routes, args.runtimes):
            results.add(**row)
            rows.append(row)
        results.write(args.json)  # after each model: an interrupted run keeps the models done
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
