"""A scope that tells ConvertLayout which conv2d layers to leave in their layout."""
from __future__ import annotations

import dataclasses
import threading
from typing import Dict, FrozenSet, Iterable, List, Optional

from ._graph import check_numbering, resolve_skip_layers

_LOCAL = threading.local()


@dataclasses.dataclass(frozen=True)
class _Counting:
    """How a scope counts the layers ConvertLayout shows it."""

    #: Ops that have layers here, each counted on its own; None: every op the handlers see.
    ops: Optional[FrozenSet[str]]
    #: Counting restarts at each entry of the scope (else it goes on from the last one).
    restarts: bool


#: Per numbering (see tvm_tcutils.tensorcore._graph.NUMBERINGS). TVM's own
#: LayoutConfig counts nn.conv2d calls (and nn.deformable_conv2d ones, which
#: the package's handlers do not see) on one count kept for the life of the object.
_COUNTINGS: Dict[str, _Counting] = {
    "chain": _Counting(ops=None, restarts=True),
    "tvm": _Counting(ops=frozenset({"nn.conv2d"}), restarts=False),
}


def _stack() -> List[list]:
    """Active scopes of this thread, innermost last, as ``[config, counts]`` pairs."""
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


class _CurrentScope(type):
    @property
    def current(cls) -> Optional["LayoutConfig"]:
        """The innermost active :class:`LayoutConfig` of this thread, or None."""
        stack = _stack()
        return stack[-1][0] if stack else None


class LayoutConfig(metaclass=_CurrentScope):
    """Choose the conv2d layers that ``relay.transform.ConvertLayout`` leaves alone.

    Inside ``with LayoutConfig(skip_layers=[...]):`` the package's ConvertLayout
    handlers for ``nn.conv2d`` and ``qnn.conv2d`` keep the layers listed in
    their original layout and convert the others. Layer ``i`` is the ``i``-th
    call of that op in dataflow order from the inputs, as numbered by
    :func:`count_layers` with that op alone (ConvertLayout visits calls in that
    order). Each op is counted on its own, so ``[0]`` keeps the first
    ``nn.conv2d`` and the first ``qnn.conv2d``.

    Counting starts at 0 each time the scope is entered: run one
    ConvertLayout (of a single-function module) per ``with`` block.
    ``numbering="tvm"`` counts as TVM's own ``relay.transform.LayoutConfig``:
    ``nn.conv2d`` layers only (other ops are converted as without a scope),
    on one count that goes on across ConvertLayout runs and entries. Scopes
    nest; the innermost one decides and, when it exits, the enclosing one
    applies again with its own count. The scope is per thread. Outside any
    such scope, TVM's own ``relay.transform.LayoutConfig`` works as before;
    inside one, this scope decides.

    Parameters
    ----------
    skip_layers : list of int, optional
        Layer indices to keep; negative indices count from the last layer and
        need ``num_layers``.
    num_layers : int, optional
        The number of layers (``count_layers(mod, [op])``); when given, indices
        are checked against it.
    numbering : {"chain", "tvm"}
        How layers are counted (see above).

    Raises
    ------
    ValueError, TypeError
        Indices that are not integers, out of range, or negative without
        ``num_layers``; an unknown numbering.

    Examples
    --------
    >>> import tvm
    >>> from tvm import relay
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> with LayoutConfig(skip_layers=[0]):
    ...     with tvm.transform.PassContext(opt_level=3):
    ...         hwnc = relay.transform.ConvertLayout({"nn.conv2d": ["HWNC", "default"]})(mod)
    >>> LayoutConfig.current is None
    True
    """

    def __init__(
        self, skip_layers: Optional[Iterable[int]] = None, num_layers: Optional[int] = None,
        numbering: str = "chain",
    ):
        bad_count = isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0
        if num_layers is not None and bad_count:
            raise TypeError(f"num_layers must be a non-negative int (from count_layers), got {num_layers!r}")
        self.numbering = check_numbering(numbering)
        self._counting = _COUNTINGS[numbering]
        self.skip_layers: FrozenSet[int] = resolve_skip_layers(skip_layers, num_layers)
        self.num_layers = num_layers
        self._last_counts: Dict[str, int] = {}

    def __repr__(self) -> str:
        return (
            f"LayoutConfig(skip_layers={sorted(self.skip_layers)}, num_layers={self.num_layers}, "
            f"numbering={self.numbering!r})"
        )

    def __enter__(self) -> "LayoutConfig":
        if self._counting.restarts:
            self._last_counts = {}
        _stack().append([self, self._last_counts])
        return self

    def __exit__(self, *exc) -> None:
        stack = _stack()
        if not stack or stack[-1][0] is not self:
            raise RuntimeError("LayoutConfig scopes must exit in the reverse order they were entered")
        stack.pop()

    @property
    def layers_seen(self) -> Dict[str, int]:
        """Layers counted per op by the latest entry of this scope (for checks after ConvertLayout).

        Under ``numbering="tvm"``: by all entries so far.
        """
        return dict(self._last_counts)

    def _count(self, op_name: str, counts: Dict[str, int]) -> Optional[int]:
        """The index of the next ``op_name`` layer, counted; None when this numbering has no such layers."""
        counting = self._counting
        if counting.ops is not None and op_name not in counting.ops:
            return None
        index = counts.get(op_name, 0)
        counts[op_name] = index + 1
        return index


def next_layer_skipped(op_name: str) -> Optional[bool]:
    """Count one more ``op_name`` layer in the innermost scope; whether to keep its layout.

    Returns None when no scope is active or the scope's numbering has no
    ``op_name`` layers (the call is then converted as without a scope).
    Called by the ConvertLayout handlers once per call they see.

    Examples
    --------
    >>> with LayoutConfig(skip_layers=[1]):
    ...     [next_layer_skipped("nn.conv2d") for _ in range(3)]
    [False, True, False]
    >>> next_layer_skipped("nn.conv2d") is None
    True
    >>> with LayoutConfig(skip_layers=[1], numbering="tvm"):
    ...     [next_layer_skipped(op) for op in ("nn.conv2d", "qnn.conv2d", "nn.conv2d")]
    [False, None, True]
    """
    stack = _stack()
    if not stack:
        return None
    config, counts = stack[-1]
    index = config._count(op_name, counts)
    return None if index is None else index in config.skip_layers
