"""int8 ``batch_matmul`` of two activations on a tile engine (AMX): attention's scores and context.

``x`` rows are the ``A`` tiles as stored (``(B, M, K)``; packed once when transposed or broadcast);
``y`` is packed once per call to ``(B, N/16, K/4, 16, 4)``, the ``B`` tile layout (on AVX-512 by the
VNNI kernels' 16 x 16 word transposes in registers). Every sign pair is native on the tiles (``tdpbuud``
for onnxruntime's u8 x u8 attention), so no operand is flipped and no correction term is summed. Each
batch and strip of ``16 * tile_b`` columns is one parallel task running one tile program
(:func:`~.dense_amx.strip_intrin`), with the elementwise ops after it fused over the strip.

Requires ``K`` to be a multiple of 64 and ``N`` of 16 (:func:`applicable`); other shapes keep the
dot-product kernels.
"""
from __future__ import annotations

from typing import Optional

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te
from tvm.topi.utils import get_const_tuple

from ..isa.x86_amx import TileISA
from .batch_matmul import WORDS_TAG, _dims, _reader
from .common import current_tile_isa, tagged_outputs
from .dense_amx import define_knobs, strip_intrin, strips
from .intrinsics import WORD_BLOCK, word_transpose_intrin

#: Tag of the tile product.
TAG = "batch_matmul_amx"


def applicable(isa: Optional[TileISA], m: int, k: int, n: int, x_dtype: str, y_dtype: str) -> str:
    """Why an ``(M, K) x (K, N)`` batch_matmul cannot run on ``isa``'s tiles, or ``""``.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> applicable(X86_AMX, 128, 64, 128, "uint8", "uint8")
    ''
    >>> applicable(X86_AMX, 128, 64, 100, "uint8", "uint8")
    'N=100 is not a multiple of 16 columns'
    """
    if isa is None:
        return "the target has no tile engine"
    if isa.variant(x_dtype, y_dtype) is None:
        return f"{isa.name} has no {x_dtype} x {y_dtype} product"
    if k % isa.depth:
        return f"K={k} is not a multiple of the tile depth {isa.depth}"
    if n % isa.columns:
        return f"N={n} is not a multiple of {isa.columns} columns"
    if m < isa.rows:
        return f"M={m} rows fill under one {isa.rows}-row tile"
    return ""


def batch_matmul_amx(cfg, x, y, out_shape=None, out_dtype="int32", transpose_a=False, transpose_b=True):
    """int8 ``batch_matmul`` on AMX tiles (arguments as :func:`~.batch_matmul.batch_matmul_dot`).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> x = te.placeholder((2, 20, 64), "uint8"); y = te.placeholder((2, 32, 64), "uint8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     out = batch_matmul_amx(autotvm.get_config(), x, y)
    >>> [int(d) for d in out.shape], out.dtype
    ([2, 20, 32], 'int32')
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for an AMX batch_matmul, got {out_dtype!r}")
    isa = current_tile_isa(str(x.dtype), str(y.dtype))
    batch, m, k, n = _dims(x, y, transpose_a, transpose_b)
    if out_shape is not None and tuple(get_const_tuple(out_shape)) != (batch, m, n):
        raise ValueError(f"out_shape {out_shape} does not match the operands' ({batch}, {m}, {n})")
    why = applicable(isa, m, k, n, str(x.dtype), str(y.dtype))
    if why:
        raise ValueError(f"batch_matmul_amx: {why}")
    lanes = isa.columns
    read_x, read_y = _reader(x, transpose_a), _reader(y, not transpose_b)
    if not transpose_a and int(x.shape[0]) == batch:
        x_pack = x
    else:
        x_pack = te.compute((batch, m, k), lambda b, i, c: read_x(b, i, c), name="bmm_data_pack", tag="dot_pack")
    words = transpose_b and lanes == WORD_BLOCK and k % (4 * WORD_BLOCK) == 0
    y_pack = te.compute(
        (batch, n // lanes, k // 4, lanes, 4),
        lambda b, o, c, ol, cs: read_y(b, o * lanes + ol, c * 4 + cs),
        name="bmm_weight_pack", tag=WORDS_TAG if words else "dot_pack",
    )
    define_knobs(cfg, isa, m, k, n // lanes)
    r_ko = te.reduce_axis((0, k // 4), name="k_outer")
    r_ki = te.reduce_axis((0, 4), name="k_inner")
    cfg.add_flop(2 * batch * m * n * k)
    return te.compute(
        (batch, m, n),
        lambda b, i, j: te.sum(x_pack[b, i, r_ko * 4 + r_ki].astype("int32")
                               * y_pack[b, j // lanes, r_ko, j % lanes, r_ki].astype("int32"), axis=[r_ko, r_ki]),
        name="batch_matmul_amx", tag=TAG,
    )


def schedule_batch_matmul_amx(cfg, outs):
    """Schedule :func:`batch_matmul_amx` (packing, the tile product, fused elementwise ops).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> x = te.placeholder((2, 20, 64), "uint8"); y = te.placeholder((2, 32, 64), "uint8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     cfg = autotvm.get_config()
    ...     out = batch_matmul_amx(cfg, x, y)
    ...     s = schedule_batch_matmul_amx(cfg, [out])
    >>> "tdpbuud" in str(tvm.lower(s, [x, y, out]))
    True
    """
    outs, product = tagged_outputs(outs, TAG)
    s = te.create_schedule([t.op for t in outs])
    x_pack, y_pack = product.op.input_tensors
    isa = current_tile_isa(str(x_pack.dtype), str(y_pack.dtype))
    _, m, k = get_const_tuple(x_pack.shape)
    for pack in (x_pack, y_pack):
        if not isinstance(pack.op, te.ComputeOp):
            continue
        axes = s[pack].op.axis
        s[pack].parallel(s[pack].fuse(axes[0], axes[1]))
        if pack.op.tag == WORDS_TAG:
            _, block = s[pack].split(axes[2], factor=WORD_BLOCK)
            s[pack].tensorize(block, word_transpose_intrin(str(pack.op.input_tensors[0].dtype), str(pack.dtype)))
        else:
            s[pack].vectorize(axes[-1])
    tile_a, tile_b, groups = cfg["tile_a"].val, cfg["tile_b"].val, cfg["groups"].val
    intrin = strip_intrin(isa, m, k, tile_a, tile_b, str(x_pack.dtype), str(y_pack.dtype), batched=True,
                          groups=groups)
    strips(s, outs, product, isa, tile_b * groups, intrin)
    return s
