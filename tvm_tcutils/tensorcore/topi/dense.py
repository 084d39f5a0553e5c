"""Dense (``out[b, o] = sum_i data[b, i] * weight[o, i]``) on integer tensor cores.

The data ``(N, I)`` and weight ``(O, I)`` are packed into WMMA tiles
``(N/m, I/k, m, k)`` and ``(O/n, I/k, n, k)`` inside the kernel (the packing is
inlined into the shared-memory copies, so it costs no extra pass over memory),
multiplied with int32 accumulation and unpacked to ``(N, O)``.

Plain functions only: registration lives in :mod:`tvm_tcutils.tensorcore.strategy`.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te, topi
from tvm.topi.utils import get_const_tuple

from . import tiled_mma, wmma

#: AutoTVM task name of the dense template.
TASK = "tcutils.dense_tensorcore.cuda"


def _pack(matrix: te.Tensor, rows: int, cols: int, name: str) -> te.Tensor:
    total_rows, total_cols = get_const_tuple(matrix.shape)
    return te.compute(
        (total_rows // rows, total_cols // cols, rows, cols),
        lambda rb, cb, r, c: matrix[rb * rows + r, cb * cols + c],
        name=name, tag="tcutils_pack",
    )


def dense(
    data: te.Tensor,
    weight: te.Tensor,
    out_dtype: str = "int32",
    shape: Optional[wmma.WmmaShape] = None,
    unit: Optional[Sequence[int]] = None,
) -> te.Tensor:
    """Dense as a packed tensor-core GEMM followed by unpacking.

    Parameters
    ----------
    data : te.Tensor
        ``(N, I)`` in int4/uint4/int8/uint8.
    weight : te.Tensor
        ``(O, I)``, same dtype.
    out_dtype : str
        Must be ``int32``.
    shape : WmmaShape, optional
        WMMA shape (default: the preferred fitting one).
    unit : (int, int), optional
        Tiling unit of the schedule knobs (default ``(shape.m, shape.n)``).

    Examples
    --------
    >>> x = te.placeholder((16, 64), "int8"); w = te.placeholder((32, 64), "int8")
    >>> dense(x, w).shape
    [16, 32]
    """
    if len(data.shape) != 2 or len(weight.shape) != 2:
        raise ValueError(
            f"dense needs 2-D data and weight, got {get_const_tuple(data.shape)} and {get_const_tuple(weight.shape)}"
        )
    n, i = get_const_tuple(data.shape)
    o, wi = get_const_tuple(weight.shape)
    if wi != i:
        raise ValueError(f"weight has {wi} input features, data has {i}")
    shape = tiled_mma.resolve_shape([data, weight], out_dtype, n, i, o, shape, names="data and weight")
    a = _pack(data, shape.m, shape.k, "data_packed")
    b = _pack(weight, shape.n, shape.k, "weight_packed")
    rb, ri = te.reduce_axis((0, i // shape.k), name="rb"), te.reduce_axis((0, shape.k), name="ri")
    gemm = tiled_mma.packed_gemm(
        (n // shape.m, o // shape.n, shape.m, shape.n),
        lambda nb, ob, mi, ni: te.sum(
            a[nb, rb, mi, ri].astype(out_dtype) * b[ob, rb, ni, ri].astype(out_dtype), axis=[rb, ri]
        ),
        shape, unit or (shape.m, shape.n), name="dense_packed",
    )
    return te.compute(
        (n, o), lambda b_, o_: gemm[b_ // shape.m, o_ // shape.n, b_ % shape.m, o_ % shape.n],
        name="dense_tensorcore", tag=topi.tag.INJECTIVE,
    )


def dense_template(cfg, data, weight, out_dtype="int32") -> te.Tensor:
    """AutoTVM compute of :data:`TASK`: :func:`dense` with the WMMA shape as a knob.

    Examples
    --------
    >>> from tvm import autotvm
    >>> x = te.placeholder((16, 64), "int8"); w = te.placeholder((32, 64), "int8")
    >>> with tvm.target.Target("cuda -arch=sm_80"):
    ...     out = dense_template(autotvm.get_config(), x, w)
    >>> out.shape, out.dtype
    ([16, 32], 'int32')
    """
    n, i = get_const_tuple(data.shape)
    o = get_const_tuple(weight.shape)[0]
    shape, unit = tiled_mma.choose_shape(cfg, data.dtype, n, i, o)
    cfg.add_flop(2 * n * i * o)
    return dense(data, weight, out_dtype, shape, unit)


def schedule_dense(cfg, outs) -> te.Schedule:
    """AutoTVM schedule of :data:`TASK` (see :mod:`.tiled_mma`).

    Lowering needs no GPU, only the target:

    Examples
    --------
    >>> from tvm import autotvm
    >>> x = te.placeholder((16, 64), "int8"); w = te.placeholder((32, 64), "int8")
    >>> with tvm.target.Target("cuda -arch=sm_80"):
    ...     cfg = autotvm.get_config()
    ...     out = dense_template(cfg, x, w)
    ...     sched = schedule_dense(cfg, [out])
    >>> "tvm_mma_sync" in str(tvm.lower(sched, [x, w, out]))
    True
    """
    return tiled_mma.schedule(cfg, outs)
