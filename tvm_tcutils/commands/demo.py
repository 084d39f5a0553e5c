"""``tvm-tcutils demo``: every landed capability on a built-in model, with a short report."""
from __future__ import annotations

import argparse

HELP = "run every capability on a built-in model and print a short report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tvm_tcutils.commands._common import add_model_argument

    add_model_argument(parser, default="resnet-18")


def run(args: argparse.Namespace) -> int:
    from tvm_tcutils.commands._checks import MODEL_CHECKS, validate
    from tvm_tcutils.commands._common import load_model_arg

    validate(args, MODEL_CHECKS)
    from tvm_tcutils.demo import run_demo

    mod, params = load_model_arg(args)
    return run_demo(args.model, mod, params)
