"""``tvm-tcutils prepare``: convert a model for the HWNC tensor-core schedules and save it."""
from __future__ import annotations

import argparse

from tvm_tcutils.commands import _checks as checks
from tvm_tcutils.tensorcore.rules import DEFAULT_PAD_FRACTION, WMMA_SHAPES

#: Checked before any work (see commands._checks).
CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("-o", "output", checks.model_output),
    checks.Check("--out-dtype", "out_dtype", checks.dtype),
    checks.Check("--pad-fraction", "pad_fraction", checks.at_least(0.0)),
)

HELP = "convert conv2d layers to HWNC int4/int8 (skipping those that cannot use tensor cores) and save the model"


def _skip_list(text: str):
    if text == "auto":
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--skip-layers must be 'auto' or comma-separated integers, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tvm_tcutils.commands._common import add_model_argument

    add_model_argument(parser)
    parser.add_argument("--dtype", choices=sorted(WMMA_SHAPES), default="int4", help="layer input type (default int4)")
    parser.add_argument("--out-dtype", default="int32", help="accumulator type (default int32)")
    parser.add_argument("--skip-layers", type=_skip_list, default="auto",
                        help="'auto' (default) or comma-separated layer indices, e.g. 0,-1")
    parser.add_argument("--pad-fraction", type=float, default=DEFAULT_PAD_FRACTION,
                        help="extra work channel padding may add and still qualify (auto)")
    parser.add_argument("-o", "--output", required=True, help="where to save the model (.json, .relay or .txt)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing output file (and its .params); without it the command refuses")


def run(args: argparse.Namespace) -> int:
    from tvm_tcutils.commands._common import load_model_arg
    from tvm_tcutils.models import save_model
    from tvm_tcutils.tensorcore import prepare_for_tensorcore

    checks.validate(args, CHECKS)
    mod, params = load_model_arg(args)
    prepared, skipped = prepare_for_tensorcore(
        mod, args.dtype, args.out_dtype, skip_layers=args.skip_layers, pad_fraction=args.pad_fraction
    )
    save_model(args.output, prepared, params)
    print(f"saved {args.output}: conv2d layers in HWNC/{args.dtype} except {len(skipped)} skipped")
    for layer in skipped:
        print(f"  {layer}")
    return 0
