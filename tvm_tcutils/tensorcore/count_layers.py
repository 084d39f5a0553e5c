"""Count the layers of given ops in a graph."""
from __future__ import annotations

from typing import Iterable, Union

from ._graph import ExprOrMod, check_numbering, numbered_layers, resolve_ops


def count_layers(expr_or_mod: ExprOrMod, valid_ops: Union[str, Iterable[str]], numbering: str = "chain") -> int:
    """Count the layers of ``valid_ops``.

    With the default numbering every call is one layer, parallel branches
    included; layer ``i`` of the other passes is the ``i``-th of these calls
    in dataflow order from the inputs (see :mod:`tvm_tcutils.tensorcore._graph`).
    ``numbering="tvm"`` returns what TVM's ``relay.analysis.count_layers``
    returns: the depth of the deepest layer of ``main``, counted from the
    output. The two agree on graphs without parallel branches.

    Parameters
    ----------
    expr_or_mod : tvm.IRModule or relay.Expr
        A module (every Relay function is counted; ``main`` alone under
        ``numbering="tvm"``) or an expression.
    valid_ops : list of str
        Op names such as ``["nn.conv2d"]``.
    numbering : {"chain", "tvm"}
        The layer numbering (:data:`tvm_tcutils.tensorcore._graph.NUMBERINGS`).

    Returns
    -------
    int
        The number of layers.

    Raises
    ------
    ValueError, TypeError
        An unknown op name or numbering, or an input that is neither a module
        nor an expression.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> count_layers(mod, ["nn.conv2d"])
    21
    >>> count_layers(mod, ["nn.conv2d"], numbering="tvm")  # the shortcut convs are parallel ones
    17
    """
    ops = resolve_ops(valid_ops, "valid_ops")
    return numbered_layers(expr_or_mod, ops, check_numbering(numbering))[0]
