"""Vector widths for TVM's x86 injective schedule where TVM's leaves the loop scalar.

TVM's x86 injective schedule splits the innermost axis by 16 lanes and vectorizes the inner loop. An
extent above 16 that 16 does not divide (28, 56: the planes of NCHW tensors after a channel slice, or
ShuffleNet's unpacked group convs) gets a guarded tail, and TVM's vectorizer then leaves the whole
loop scalar: ShuffleNet's requantize after a 136x28x28 group conv took 2.4 ns an element, 254 us.
:func:`schedule_injective` splits such a loop by the largest divisor of its extent up to 16 lanes
instead (28 and 56: 14), with the same parallel outer loops; every other group keeps TVM's schedule
(the hook delegates: None). Same computes, so the same results.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from tvm import te, topi
from tvm.topi.utils import get_const_tuple

#: Lanes TVM's x86 injective schedule splits the innermost loop by.
TVM_LANES = 16


def vector_factor(extent: int, limit: int = TVM_LANES) -> int:
    """The lanes to vectorize an innermost loop of ``extent`` by: the extent itself up to ``limit``, else
    its largest divisor up to ``limit`` (a loop without a tail).

    Examples
    --------
    >>> vector_factor(14), vector_factor(28), vector_factor(56), vector_factor(112), vector_factor(17)
    (14, 14, 14, 16, 1)
    """
    if extent <= limit:
        return extent
    return max(d for d in range(1, limit + 1) if extent % d == 0)


def scalar_in_tvm(extent: int) -> bool:
    """Whether TVM's x86 injective schedule leaves an innermost loop of ``extent`` scalar (a tail of its
    16-lane split).

    Examples
    --------
    >>> [scalar_in_tvm(e) for e in (14, 16, 28, 64, 56)]
    [False, False, True, False, True]
    """
    return extent > TVM_LANES and extent % TVM_LANES != 0


def _tail(out: te.Tensor) -> bool:
    shape = get_const_tuple(out.shape)
    return bool(shape) and all(isinstance(d, int) for d in shape) and scalar_in_tvm(shape[-1])


def schedule_injective(outs: Union[te.Tensor, Sequence[te.Tensor]]) -> Optional[te.Schedule]:
    """TVM's x86 injective schedule, each output's innermost loop split by :func:`vector_factor`, for a
    group where TVM's would leave an output's loop scalar; None for every other group.

    Examples
    --------
    >>> import tvm
    >>> x = te.placeholder((1, 8, 28, 28), "int32")
    >>> y = te.compute(x.shape, lambda *i: (x(*i) * 3).astype("uint8"))
    >>> s = schedule_injective(y)
    >>> "uint8x14" in str(tvm.lower(s, [x, y])), schedule_injective(te.compute((4, 32), lambda i, j: i + j))
    (True, None)
    """
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    if not any(_tail(out) for out in outs):
        return None
    s = te.create_schedule([out.op for out in outs])
    te.schedule.AutoInlineInjective(s)
    for out in outs:
        shape = get_const_tuple(out.shape)
        if not shape or 0 in shape:
            continue
        axes = list(s[out].op.axis)
        # TVM's parallel loops: the three outer axes of a blocked tensor, two of a plain one.
        outer = 3 if len(axes) >= 5 else 2 if len(axes) >= 3 else 0
        if outer:
            s[out].parallel(s[out].fuse(*axes[:outer]))
        lanes = vector_factor(shape[-1])
        lo, li = s[out].split(axes[-1], factor=lanes)
        if lanes > 1:
            s[out].vectorize(li)
        if not outer:
            s[out].parallel(lo if len(axes) == 1 else axes[0])
    return s


def schedule_or_tvms(outs: Union[te.Tensor, Sequence[te.Tensor]]) -> te.Schedule:
    """:func:`schedule_injective` where it improves on TVM's x86 injective schedule, else TVM's (under the
    current target).

    Examples
    --------
    >>> import tvm
    >>> x = te.placeholder((4, 32), "int32")
    >>> with tvm.target.Target("llvm"):
    ...     s = schedule_or_tvms(te.compute(x.shape, lambda i, j: x[i, j] + 1))
    >>> isinstance(s, te.Schedule)
    True
    """
    return schedule_injective(outs) or topi.x86.schedule_injective(outs)
