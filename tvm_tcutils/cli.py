"""The ``tvm-tcutils`` command line: one entry, each subcommand a thin call into the API.

Subcommands live in :mod:`tvm_tcutils.commands`, one module each, listed in
:data:`COMMANDS`; a module provides ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Errors the user can fix (a bad model, a bad option) end
the program with one line on stderr and a non-zero status, no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

# Re-exported: the subcommands share them through commands._common (importing this module back
# would be a cycle); callers that know them as cli.* keep working.
from .commands._common import CommandError, add_model_argument, load_model_arg  # noqa: F401

#: Subcommand name -> module under ``tvm_tcutils.commands``.
COMMANDS = {
    "info": "info",
    "demo": "demo",
    "count-layers": "count_layers",
    "prepare": "prepare",
    "tune": "tune",
    "bench": "bench",
    "collage": "collage",
}

#: Exit status for errors in the user's input.
USAGE_ERROR = 2


def _add_verbosity(parser: argparse.ArgumentParser, default: str) -> None:
    """``-q``/``-v``; a subcommand's copy has no default, so it does not undo the one before the command."""
    chatter = parser.add_mutually_exclusive_group()
    chatter.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const="quiet", default=default,
                         help="print errors only on stderr (no warnings, no progress bars)")
    chatter.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const="verbose", default=default,
                         help="also show the package's info messages and TVM's own warnings (C++ and AutoTVM)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-tcutils",
        description="Tensor-core preparation, int8 dot-product schedules and Collage for Apache TVM.",
    )
    import tvm

    import tvm_tcutils

    parser.add_argument("--version", action="version",
                        version=f"tvm-tcutils {tvm_tcutils.__version__} (TVM {tvm.__version__})")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    _add_verbosity(parser, default="default")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"tvm_tcutils.commands.{module_name}")
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        _add_verbosity(cmd, default=argparse.SUPPRESS)  # also after the command: 'bench MODEL -q'
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; returns the exit status.

    Examples
    --------
    >>> main(["info"])  # doctest: +ELLIPSIS
    tvm-tcutils ...
    TVM 0.19...
    registered hooks (...):
    ...
    0
    """
    try:
        import tvm_tcutils  # noqa: F401  (checks TVM, registers hooks)
    except ImportError as err:
        print(f"tvm-tcutils: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    from . import processes
    from .commands._verbosity import verbosity
    from .models import ModelError

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        with verbosity(args.verbosity), \
                processes.reaper(enabled=args.command in processes.REAPED_COMMANDS):  # none left if we are killed
            return int(args._run(args) or 0)
    except (CommandError, ModelError, ValueError, TypeError, KeyError, FileNotFoundError) as err:
        if args.debug:
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"tvm-tcutils: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("tvm-tcutils: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output left (`... | head`): not an error. Point stdout at /dev/null so
        # that the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
