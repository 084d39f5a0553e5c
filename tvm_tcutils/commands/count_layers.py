"""``tvm-tcutils count-layers``: the layer table of a model."""
from __future__ import annotations

import argparse

from tvm_tcutils.commands import _checks as checks
from tvm_tcutils.tensorcore._graph import NUMBERINGS
from tvm_tcutils.tensorcore.rules import DEFAULT_PAD_FRACTION, WMMA_SHAPES

#: Checked before any work (see commands._checks).
CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("--ops", "ops", checks.op_names),
    checks.Check("--pad-fraction", "pad_fraction", checks.at_least(0.0)),
)

HELP = "print one row per layer of the given ops: shapes, types, layouts, HWNC tensor-core verdict"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tvm_tcutils.commands._common import add_model_argument

    add_model_argument(parser)
    parser.add_argument("--ops", nargs="+", default=["nn.conv2d"], help="op names whose calls are layers")
    parser.add_argument("--dtype", choices=sorted(WMMA_SHAPES), default="int4",
                        help="tensor-core type the verdict assumes (default int4)")
    parser.add_argument("--pad-fraction", type=float, default=DEFAULT_PAD_FRACTION,
                        help="extra work channel padding may add and still qualify")
    parser.add_argument("--numbering", choices=list(NUMBERINGS), default="chain",
                        help="layer index column: chain (every call its own index, default) or tvm "
                             "(TVM 0.19's recast numbering: by depth, parallel layers share an index)")


def run(args: argparse.Namespace) -> int:
    from tvm_tcutils.commands._common import load_model_arg
    from tvm_tcutils.tensorcore.layer_table import HEADER, layer_table

    checks.validate(args, CHECKS)
    mod, _ = load_model_arg(args)
    rows = layer_table(mod, args.ops, dtype=args.dtype, pad_fraction=args.pad_fraction, numbering=args.numbering)
    print(HEADER)
    for row in rows:
        print(row)
    qualifying = sum(row.qualifies for row in rows)
    print(f"{len(rows)} layers of {', '.join(args.ops)}; {qualifying} qualify for HWNC tensor cores ({args.dtype})")
    return 0
