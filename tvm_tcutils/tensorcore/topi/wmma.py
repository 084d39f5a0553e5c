"""WMMA (CUDA warp matrix multiply-accumulate) shapes and tensor intrinsics.

A WMMA operation computes ``C[m, n] += A[m, k] * B[k, n]`` for one warp on
fragments held in registers. TVM exposes the CUDA calls as TIR builtins
(``tvm_load_matrix_sync``, ``tvm_mma_sync``, ``tvm_fill_fragment``,
``tvm_store_matrix_sync``); this module declares TE tensor intrinsics around
them, parameterized by the WMMA shape and the operand type, so that a schedule
can ``tensorize`` the inner tile loops of a packed GEMM.

Tile conventions used throughout :mod:`tvm_tcutils.tensorcore.topi`:

* an A tile is ``m x k`` with ``k`` innermost (row major);
* a B tile is stored ``n x k`` with ``k`` innermost, which is the ``k x n``
  matrix in column-major order (so the reduction axis is innermost in both);
* an accumulator tile is ``m x n`` with ``n`` innermost (row major), int32.
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..._tvm import tvm
from tvm import te

# The tile shapes, minimum archs and accumulator type are the package's rules
# (one source for the passes and the schedules); re-exported for the kernels.
from ..rules import ACCUMULATOR_DTYPE, MIN_ARCH, WMMA_SHAPES, WmmaShape  # noqa: F401

#: Storage scopes of the three fragment kinds, as TVM's CUDA backend names them.
FRAGMENT_SCOPES = {"a": "wmma.matrix_a", "b": "wmma.matrix_b", "acc": "wmma.accumulator"}

def shape_for(dtype: str, m: Optional[int] = None, n: Optional[int] = None) -> WmmaShape:
    """The WMMA shape of ``dtype`` with the given ``m`` (or ``n``), else the preferred one.

    Raises
    ------
    ValueError
        For an operand type without integer WMMA support or a shape CUDA lacks.

    Examples
    --------
    >>> shape_for("int8", m=32)
    WmmaShape(m=32, n=8, k=16)
    """
    if dtype not in WMMA_SHAPES:
        raise ValueError(f"dtype {dtype!r} has no integer WMMA shape; valid: {sorted(WMMA_SHAPES)}")
    for shape in WMMA_SHAPES[dtype]:
        if (m is None or shape.m == m) and (n is None or shape.n == n):
            return shape
    valid = ", ".join(s.name for s in WMMA_SHAPES[dtype])
    raise ValueError(f"no {dtype} WMMA shape with m={m}, n={n}; valid shapes: {valid}")


def _strided_buffer(tensor: te.Tensor, scope: str, name: str, offset_factor: int) -> tvm.tir.Buffer:
    """A 2-D buffer with a free row stride, for tiles inside larger arrays."""
    return tvm.tir.decl_buffer(
        tensor.shape, tensor.dtype, name=name, scope=scope,
        strides=[te.var(f"{name}_ldm"), 1], offset_factor=offset_factor, data_alignment=16,
    )


def _fragment_buffer(tensor: te.Tensor, scope: str, name: str) -> tvm.tir.Buffer:
    """A fragment buffer; whole fragments are contiguous, so the offset is a multiple of one."""
    rows, cols = (int(x) for x in tensor.shape)
    return tvm.tir.decl_buffer(
        tensor.shape, tensor.dtype, name=name, scope=scope,
        strides=[te.var(f"{name}_s"), 1], offset_factor=rows * cols,
    )


def _fragment_index(buf: tvm.tir.Buffer, rows: int, cols: int):
    # Fragments of one allocation are numbered by their position in it.
    return buf.elem_offset // (rows * cols)


def _sync_copy(builtin: str, shape: WmmaShape, fragment, tile: Tuple[int, int], pointer, ldm, layout: str):
    """One warp-wide copy between a fragment and memory (``tvm_load/store_matrix_sync``)."""
    builder = tvm.tir.ir_builder.create()
    builder.emit(
        tvm.tir.call_intrin(
            "handle", builtin, fragment.data, shape.m, shape.n, shape.k,
            _fragment_index(fragment, *tile), pointer, ldm, layout,
        )
    )
    return builder.get()


def load_matrix(shape: WmmaShape, operand: str, dtype: str, scope: str = "shared") -> te.TensorIntrin:
    """Intrinsic copying one A (``m x k``) or B (``n x k``) tile from ``scope`` into a fragment.

    Parameters
    ----------
    shape : WmmaShape
        The WMMA shape.
    operand : {"a", "b"}
        Which operand the fragment feeds.
    dtype : str
        Operand type (``int4``, ``uint4``, ``int8``, ``uint8``).
    scope : str
        Where the tile comes from (``shared`` or ``global``).

    Examples
    --------
    >>> intrin = load_matrix(WmmaShape(8, 8, 32), "a", "int4")
    >>> intrin.name, intrin.op.output(0).dtype
    ('wmma_load_a', 'int4')
    """
    if operand not in ("a", "b"):
        raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")
    rows = shape.m if operand == "a" else shape.n
    src = te.placeholder((rows, shape.k), dtype=dtype, name="src")
    dst = te.compute((rows, shape.k), lambda i, j: src[i, j], name="dst")
    src_buf = _strided_buffer(src, scope, "src", offset_factor=max(1, 128 // _bits(dtype)))
    dst_buf = _fragment_buffer(dst, FRAGMENT_SCOPES[operand], "dst")
    # B tiles are n x k with k innermost: the k x n matrix stored column by column.
    layout = "row_major" if operand == "a" else "col_major"

    def _emit(ins, outs):
        return _sync_copy("tir.tvm_load_matrix_sync", shape, outs[0], (rows, shape.k), ins[0].access_ptr("r"),
                          ins[0].strides[0], layout)

    return te.decl_tensor_intrin(dst.op, _emit, binds={src: src_buf, dst: dst_buf}, name=f"wmma_load_{operand}")


def mma(shape: WmmaShape, dtype: str) -> te.TensorIntrin:
    """Intrinsic ``acc[m, n] += sum_k a[m, k] * b[n, k]`` on fragments (reset fills zeros).

    Examples
    --------
    >>> intrin = mma(WmmaShape(16, 16, 16), "int8")
    >>> intrin.name, [t.dtype for t in intrin.inputs]
    ('wmma_mma', ['int8', 'int8'])
    """
    a = te.placeholder((shape.m, shape.k), dtype=dtype, name="a")
    b = te.placeholder((shape.n, shape.k), dtype=dtype, name="b")
    red = te.reduce_axis((0, shape.k), name="kk")
    acc = te.compute(
        (shape.m, shape.n),
        lambda i, j: te.sum(a[i, red].astype(ACCUMULATOR_DTYPE) * b[j, red].astype(ACCUMULATOR_DTYPE), axis=red),
        name="acc",
    )
    binds = {
        a: _fragment_buffer(a, FRAGMENT_SCOPES["a"], "a"),
        b: _fragment_buffer(b, FRAGMENT_SCOPES["b"], "b"),
        acc: _fragment_buffer(acc, FRAGMENT_SCOPES["acc"], "acc"),
    }

    def _emit(ins, outs):
        fa, fb = ins
        (fc,) = outs
        ia = _fragment_index(fa, shape.m, shape.k)
        ib = _fragment_index(fb, shape.n, shape.k)
        ic = _fragment_index(fc, shape.m, shape.n)

        def _fill():
            builder = tvm.tir.ir_builder.create()
            builder.emit(
                tvm.tir.call_intrin(
                    "handle", "tir.tvm_fill_fragment", fc.data, shape.m, shape.n, shape.k, ic,
                    tvm.tir.const(0, ACCUMULATOR_DTYPE),
                )
            )
            return builder.get()

        def _update():
            builder = tvm.tir.ir_builder.create()
            builder.emit(
                tvm.tir.call_intrin(
                    "handle", "tir.tvm_mma_sync", fc.data, ic, fa.data, ia, fb.data, ib, fc.data, ic
                )
            )
            return builder.get()

        return _update(), _fill(), _update()

    return te.decl_tensor_intrin(acc.op, _emit, binds=binds, name="wmma_mma")


def store_matrix(shape: WmmaShape, scope: str = "global") -> te.TensorIntrin:
    """Intrinsic writing one ``m x n`` int32 accumulator fragment to ``scope`` (row major).

    Examples
    --------
    >>> intrin = store_matrix(WmmaShape(8, 8, 32))
    >>> intrin.name
    'wmma_store'
    """
    frag = te.placeholder((shape.m, shape.n), dtype=ACCUMULATOR_DTYPE, name="frag")
    dst = te.compute((shape.m, shape.n), lambda i, j: frag[i, j], name="dst")
    frag_buf = _fragment_buffer(frag, FRAGMENT_SCOPES["acc"], "frag")
    dst_buf = _strided_buffer(dst, scope, "dst", offset_factor=4)

    def _emit(ins, outs):
        return _sync_copy("tir.tvm_store_matrix_sync", shape, ins[0], (shape.m, shape.n), outs[0].access_ptr("w"),
                          outs[0].strides[0], "row_major")

    return te.decl_tensor_intrin(dst.op, _emit, binds={frag: frag_buf, dst: dst_buf}, name="wmma_store")


def _bits(dtype: str) -> int:
    return tvm.runtime.DataType(dtype).bits
