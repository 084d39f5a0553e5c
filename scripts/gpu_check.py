#!/usr/bin/env python
"""The GPU check of the tensor-core kernels (harness: ``tvm_tcutils.bench.gpu_check``); run by scripts/gpu_check.sh.

Parts: ``resnet50`` (int8 ResNet-50 on the GPU against the CPU reference, then end to end
against TVM's own HWNC template), ``layers`` (per layer, against TVM's template),
``dense`` (against cuBLASLt's int8 GEMM and the GPU's peak), ``tune`` and ``tune_dense``
(AutoTVM tuning on this GPU of the ResNet-50's tensor-core layers and of a 4096^3 dense, tuned
against untuned), ``int4_probe`` (one int4 WMMA tile outside TVM, through CuPy). Without a GPU it
rehearses: everything up to the first kernel launch, for ``--arch``.

Usage::

    PYTHONPATH=. python scripts/gpu_check.py --json out.json [--parts resnet50,layers,dense] [--arch sm_90]
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402,F401  (registers the hooks, loads the CUDA plugin)
from tvm_tcutils import cuda  # noqa: E402
from tvm_tcutils.bench import gpu_check  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402

PARTS = ("resnet50", "tune", "tune_mma", "tune_dense", "tune_dense_mma", "tune_dense_wgmma", "exact", "layers",
         "dense", "bert", "int4_probe", "profile", "int4_cast", "int4", "stem", "int4_diag", "int4_speed")


def _parts(text: str) -> list:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"unknown part(s) {unknown}; valid: {', '.join(PARTS)}")
    return parts


def main(argv=None) -> int:
    # A crash (an int4 ResNet-50 step died with SIGSEGV on an H200) prints the Python stack that led to it.
    faulthandler.enable()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=_parts, default=list(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--arch", default="sm_90", help="architecture to build for when there is no GPU")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--tune-budget", type=float, default=240.0,
                        help="seconds of AutoTVM tuning for ResNet-50's tensor-core layers (part tune)")
    parser.add_argument("--tune-trials", type=int, help="trials per task (parts tune, tune_dense; default 32, 64)")
    parser.add_argument("--tune-dense-budget", type=float, default=60.0,
                        help="seconds of AutoTVM tuning for the 4096^3 dense (part tune_dense)")
    parser.add_argument("--wait-for", metavar="FILE", help="time only after FILE exists (another job's end)")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    info = cuda.status()
    if not info["codegen"]:
        print(f"error: no CUDA code generation: {info['reason']}", file=sys.stderr)
        return 2
    arch = gpu_check.device_arch(args.arch)
    results = Results(__file__, argv, arch=arch, batch=args.batch, rounds=args.rounds, cuda=info,
                      rehearsal=not gpu_check.gpu_present())
    if gpu_check.gpu_present():
        import tvm

        results.settings["gpu"] = str(tvm.cuda(0).device_name)
    print(f"gpu_check: arch {arch}, GPU: {results.settings.get('gpu', 'none (rehearsal)')}", flush=True)
    wait = gpu_check.wait_for_file(args.wait_for)
    failed = []
    for part in args.parts:
        try:
            if part == "resnet50":
                gpu_check.resnet50(results, arch, args.batch, args.rounds, wait,
                                   torch_python=os.environ.get("TORCH_PYTHON", "python3"))
            elif part in ("tune", "tune_mma", "tune_dense", "tune_dense_mma", "tune_dense_wgmma"):  # log beside JSON
                model = {"tune": "resnet50", "tune_mma": "resnet50_mma", "tune_dense": "dense",
                         "tune_dense_mma": "dense_mma", "tune_dense_wgmma": "dense_wgmma"}[part]
                gpu_check.tune(results, arch, model, args.batch, args.rounds,
                               budget_s=args.tune_budget if part in ("tune", "tune_mma") else args.tune_dense_budget,
                               trials=args.tune_trials,
                               log_dir=os.path.dirname(os.path.abspath(args.json)), wait=wait)
            else:
                wait()
                if part == "layers":
                    gpu_check.layers(results, arch, args.batch, args.rounds)
                elif part == "exact":
                    gpu_check.exact(results, arch, args.batch)
                elif part == "int4_speed":
                    gpu_check.int4_speed(results, arch, args.batch, args.rounds)
                elif part == "int4_diag":
                    gpu_check.int4_diag(results, arch, os.environ.get("TORCH_PYTHON", "python3"))
                elif part == "stem":
                    gpu_check.stem(results, arch, args.rounds)
                elif part == "int4":
                    gpu_check.int4(results, arch, args.batch, args.rounds)
                elif part == "int4_cast":
                    gpu_check.int4_cast(results, arch)
                elif part == "profile":
                    gpu_check.profile(results, arch, args.batch)
                elif part == "bert":
                    gpu_check.bert(results, arch, args.rounds, torch_python=os.environ.get("TORCH_PYTHON", "python3"),
                                   work_dir=os.path.dirname(os.path.abspath(args.json)))
                elif part == "int4_probe":
                    gpu_check.int4_probe(results, os.environ.get("TORCH_PYTHON", "python3"))
                else:
                    gpu_check.dense(results, arch, args.rounds, torch_python=os.environ.get("TORCH_PYTHON", "python3"))
        except Exception as err:  # noqa: BLE001  (a lease is short: report the part, go on to the next)
            failed.append(part)
            results.add(part=part, error=f"{type(err).__name__}: {str(err).strip()[-800:]}")
            print(f"{part} FAILED: {type(err).__name__}: {str(err).strip()[-800:]}", flush=True)
        results.settings.update(gpu_check.summary(results.rows))
        results.write(args.json)  # after every part: a cut run keeps what it measured
    print("summary:", gpu_check.summary(results.rows), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
