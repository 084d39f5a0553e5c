"""Count the layers of given ops in a graph."""
from __future__ import annotations

from typing import Iterable, Union

from ._graph import ExprOrMod, layer_calls, relay_functions, resolve_ops


def count_layers(expr_or_mod: ExprOrMod, valid_ops: Union[str, Iterable[str]]) -> int:
    """Count the calls to any op in ``valid_ops``.

    Every call is one layer, parallel branches included; layer ``i`` of the
    other passes is the ``i``-th of these calls in dataflow order from the
    inputs (see :mod:`tvm_tcutils.tensorcore._graph`). TVM's own
    ``relay.analysis.count_layers`` instead returns the longest chain of such
    calls, which equals this count on graphs without parallel branches.

    Parameters
    ----------
    expr_or_mod : tvm.IRModule or relay.Expr
        A module (every Relay function is counted) or an expression.
    valid_ops : list of str
        Op names such as ``["nn.conv2d"]``.

    Returns
    -------
    int
        The number of matching calls.

    Raises
    ------
    ValueError, TypeError
        An unknown op name or an input that is neither a module nor an expression.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> count_layers(mod, ["nn.conv2d"])
    21
    """
    ops = resolve_ops(valid_ops, "valid_ops")
    relay_functions(expr_or_mod)  # type check of the argument
    return len(layer_calls(expr_or_mod, ops))
