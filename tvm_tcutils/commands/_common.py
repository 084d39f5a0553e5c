"""What the subcommands share: the ``MODEL`` argument, loading it, and the error reported as one line.

It lives here, not in :mod:`tvm_tcutils.cli`, because ``cli`` loads the
subcommands: subcommands importing ``cli`` back would make the two import each
other. ``cli`` re-exports these names, so ``tvm_tcutils.cli.CommandError`` and
this module's are the same class.
"""
from __future__ import annotations

import argparse
from typing import Optional


class CommandError(Exception):
    """An error to report to the user as one line.

    Examples
    --------
    >>> str(CommandError("--repeat must be at least 1"))
    '--repeat must be at least 1'
    """


def add_model_argument(parser: argparse.ArgumentParser, default: Optional[str] = None) -> None:
    """Add the shared ``MODEL`` argument and its options to a subcommand parser.

    Examples
    --------
    >>> p = argparse.ArgumentParser(); add_model_argument(p)
    >>> p.parse_args(["resnet-18"]).model
    'resnet-18'
    """
    nargs = "?" if default else None
    parser.add_argument(
        "model", nargs=nargs, default=default,
        help="built-in model name (see 'tvm-tcutils info --models'), or an .onnx / .json / .relay file",
    )
    parser.add_argument("--batch-size", type=int, default=1, help="batch size of built-in models")
    parser.add_argument(
        "--weights", choices=["he", "zoo"], default="he",
        help="built-in models: realistic He-style weights (default) or relay.testing's own",
    )


def load_model_arg(args: argparse.Namespace):
    """Load the model named by the shared arguments (see :func:`add_model_argument`).

    Examples
    --------
    >>> p = argparse.ArgumentParser(); add_model_argument(p)
    >>> mod, params = load_model_arg(p.parse_args(["mlp"]))
    >>> "main" in [gv.name_hint for gv in mod.get_global_vars()]
    True
    """
    from ..models import load_model

    return load_model(args.model, batch_size=args.batch_size, weights=args.weights)
