"""Row schedule for 8-bit constant pads whose innermost axis is padded (an image's ``NCHW`` pad).

TVM's x86 injective schedule fuses the pad's axes and vectorizes the innermost
chunk with the in-bounds test inside each lane: on a ``u8 (1, 3, 224, 224)``
image padded by 3 (the QDQ stem's zero-point pad) that is 35 us, and 219 us for
a ``(1, 64, 112, 112)`` plane. Here each output row is one parallel
iteration and its columns a plain loop: LLVM splits the loop at the pad's
bounds and copies the middle with vector moves, 3.8 and 28 us (one core,
``scripts/bench_int8.py --pads-only``). Same compute as TVM's (the op's own
``FTVMCompute``), so same results; blocked pads (``NCHW{b}c``, the innermost axis
unpadded) keep TVM's schedule, which already moves whole vectors.
"""
from __future__ import annotations

from typing import Sequence, Union

from tvm import te, topi

_INT8 = ("int8", "uint8")


def row_pad_applies(pad_width: Sequence[Sequence[int]], dtype: str, pad_mode: str = "constant") -> bool:
    """Whether :func:`schedule_row_pad` takes a pad: 8-bit, constant, at least 2-D, innermost axis padded.

    Examples
    --------
    >>> row_pad_applies([(0, 0), (0, 0), (3, 3), (3, 3)], "uint8")
    True
    >>> row_pad_applies([(0, 0), (0, 0), (1, 1), (1, 1), (0, 0)], "uint8")  # NCHW16c: TVM's is as fast
    False
    >>> row_pad_applies([(0, 0), (1, 1)], "float32"), row_pad_applies([(0, 0), (1, 1)], "int8", "edge")
    (False, False)
    """
    widths = [tuple(int(v) for v in pair) for pair in pad_width]
    return str(dtype) in _INT8 and pad_mode == "constant" and len(widths) >= 2 and widths[-1] != (0, 0)


def schedule_row_pad(outs: Union[te.Tensor, Sequence[te.Tensor]]) -> te.Schedule:
    """Schedule a (fused) pad group: ops before the pad inlined, one parallel iteration per output row.

    A group that is not a single output of at least two axes gets TVM's x86 injective schedule.

    Examples
    --------
    >>> import numpy as np, tvm
    >>> x = te.placeholder((1, 3, 8, 8), "uint8", name="x")
    >>> y = topi.nn.pad(x, [0, 0, 1, 1], [0, 0, 1, 1], pad_value=tvm.tir.const(5, "uint8"))
    >>> f = tvm.build(schedule_row_pad(y), [x, y], "llvm")
    >>> out = tvm.nd.empty((1, 3, 10, 10), "uint8"); f(tvm.nd.array(np.ones((1, 3, 8, 8), "uint8")), out)
    >>> int(out.numpy()[0, 0, 0, 0]), int(out.numpy()[0, 0, 1, 1])
    (5, 1)
    """
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    if len(outs) != 1 or len(outs[0].shape) < 2:
        return topi.x86.schedule_injective(outs)
    out = outs[0]
    s = te.create_schedule(out.op)
    te.schedule.AutoInlineInjective(s)
    # No explicit vectorize: a vector of lanes each testing its own bounds is what makes TVM's slow;
    # the plain column loop lets LLVM peel the pad and vectorize the copy.
    s[out].parallel(s[out].fuse(*s[out].op.axis[:-1]))
    return s
