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


def add_target_argument(parser: argparse.ArgumentParser, what: str = "TVM target") -> None:
    """Add ``--target`` (default: this CPU's target, :func:`tvm_tcutils.host_target`); checked by
    :func:`~tvm_tcutils.commands._checks.runnable_target` before any work.

    Examples
    --------
    >>> p = argparse.ArgumentParser(); add_target_argument(p)
    >>> p.parse_args([]).target is None
    True
    """
    parser.add_argument("--target", default=None,
                        help=f"{what} (default: this CPU's, tvm_tcutils.host_target(), e.g. 'llvm -mcpu=znver4')")


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


def add_rpc_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--rpc-tracker HOST:PORT`` and ``--rpc-key KEY``: measure on the servers of TVM's RPC tracker.

    A key turns remote measurement on (``--rpc-key``, or the environment's
    ``TVM_TCUTILS_RPC_KEY``); the tracker is ``--rpc-tracker``, or AutoTVM's
    ``TVM_TRACKER_HOST``/``TVM_TRACKER_PORT``.

    Examples
    --------
    >>> p = argparse.ArgumentParser(); add_rpc_arguments(p)
    >>> p.parse_args(["--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "rasp4"]).rpc_key
    'rasp4'
    """
    import os

    group = parser.add_argument_group("measuring on devices through TVM's RPC tracker (docs/rpc.md)")
    group.add_argument("--rpc-tracker", metavar="HOST:PORT", default=None,
                       help="the RPC tracker (default: $TVM_TRACKER_HOST:$TVM_TRACKER_PORT when a key is given)")
    group.add_argument("--rpc-key", metavar="KEY", default=os.environ.get("TVM_TCUTILS_RPC_KEY") or None,
                       help="measure on the tracker's servers of this device key instead of this machine "
                            "(default: $TVM_TCUTILS_RPC_KEY)")


def rpc_backend(args: argparse.Namespace):
    """The :class:`tvm_tcutils.rpc.RemoteBackend` the ``--rpc-*`` arguments name, or None (measure here).

    Run the ``RPC_CHECKS`` of :mod:`._checks` first: they turn bad settings into one-line errors.

    Examples
    --------
    >>> rpc_backend(argparse.Namespace(rpc_tracker=None, rpc_key=None)) is None
    True
    """
    from ..rpc import RemoteBackend, parse_tracker, tracker_from_env

    if not getattr(args, "rpc_key", None):
        return None
    tracker = parse_tracker(args.rpc_tracker) if args.rpc_tracker else tracker_from_env()
    if tracker is None:
        raise CommandError("--rpc-key needs --rpc-tracker HOST:PORT (or TVM_TRACKER_HOST and TVM_TRACKER_PORT)")
    return RemoteBackend(tracker, args.rpc_key)
