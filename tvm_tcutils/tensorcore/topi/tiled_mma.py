"""The CUDA schedule shared by the packed tensor-core GEMMs (conv2d HWNC and dense).

Both computes end in a *packed GEMM* stage, tagged :data:`PACKED_GEMM_TAG`::

    C[lead..., rb, cb, mi, ni] = sum_{outer..., kb, ki} A[..., rb, kb, mi, ki] * B[..., cb, kb, ni, ki]

with WMMA tiles ``(mi, ki)``, ``(ni, ki)`` and ``(mi, ni)`` innermost. ``lead``
are spatial axes (conv2d: output rows and columns; dense: none) and ``outer``
extra reduction axes (conv2d: kernel rows and columns).

The schedule:

* grid: ``blockIdx.z`` over the fused ``lead`` axes, ``blockIdx.x``/``y`` over
  row/column tile groups; ``threadIdx.y``/``z`` index the warps of a block and
  ``threadIdx.x`` the 32 lanes of a warp;
* each warp keeps ``rows x cols`` accumulator fragments, loops over the
  reduction in chunks of ``chunk`` ``k``-tiles, stages the A and B tiles of the
  whole block in shared memory (packing, padding and kernel layout are inlined
  into these cooperative copies), loads fragments and issues ``mma_sync``;
* fragments are stored straight to the packed output, and the unpacking to
  the user's layout (plus any fused element-wise ops) runs as a second,
  element-wise kernel.

Knobs (sizes in units of the *largest* candidate WMMA tile, so that every value
of the ``wmma_m`` knob accepts every tiling): ``tile_rows`` and ``tile_cols``
(split into blocks, warps per block and tiles per warp), ``chunk`` (``k``-tiles
per shared-memory stage), ``copy_lanes`` (vector width of the shared-memory
copies), ``unroll_max_step``/``unroll_explicit`` (unrolling of the reduction
loops) and, from the compute, ``wmma_m`` (the WMMA shape). Their ranges keep
every configuration within 48 KB of static shared memory (at most 8 x 32 rows
and columns x 4 chunks x 16 bytes per operand = 2 x 16 KB) and 512 threads per
block (4 x 4 warps).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..._tvm import tvm
from tvm import te
from tvm.autotvm.task.space import OtherOptionEntity

from ..rules import fitting_shapes
from . import wmma

#: Tag of the packed GEMM stage the schedule looks for.
PACKED_GEMM_TAG = "tcutils_packed_gemm"

#: Lanes of a warp.
WARP_SIZE = 32

#: Limits of the tiling knobs (warps along one dimension, tiles per warp, their product, chunk).
MAX_WARPS, MAX_TILES, MAX_WARP_TILES, CHUNKS = 4, 4, 8, (1, 2, 4)

#: Elements each thread moves per global-to-shared copy (one vector access).
COPY_LANES = (4, 8, 16, 32)


def copy_lanes(bits: int) -> List[int]:
    """Vector widths of the shared-memory copies for ``bits``-bit elements.

    At least 32 bits, so that 4-bit elements always travel in whole words
    (CUDA has no scalar 4-bit type); at most 16 lanes of at least a byte,
    because ``verify_gpu_code`` (and AutoTVM's check with it) counts a
    sub-byte lane as a whole byte against the 16-byte vector limit.

    Examples
    --------
    >>> copy_lanes(8), copy_lanes(4)
    ([4, 8, 16], [8, 16])
    """
    return [lanes for lanes in COPY_LANES if lanes * bits >= 32 and lanes * max(bits, 8) <= 128]


#: Choices of the ``auto_unroll_max_step`` pragma on the reduction loops.
UNROLL_STEPS = (0, 16, 64, 512)

#: Threads per block of the element-wise unpacking kernel.
UNPACK_THREADS = 256


def packed_gemm(
    shape_out: Sequence,
    fcompute,
    shape: wmma.WmmaShape,
    unit: Sequence[int],
    name: str,
) -> te.Tensor:
    """Declare the packed GEMM stage, recording the WMMA shape and tiling unit as attributes.

    ``unit`` is ``(rows, cols)`` of the largest candidate WMMA tile, the unit
    of the ``tile_rows``/``tile_cols`` knobs.

    Examples
    --------
    >>> a = te.placeholder((1, 1, 8, 32), "int8"); b = te.placeholder((1, 1, 8, 32), "int8")
    >>> k0 = te.reduce_axis((0, 1)); k1 = te.reduce_axis((0, 32))
    >>> c = packed_gemm((1, 1, 8, 8), lambda r, c, i, j: te.sum(
    ...     a[r, k0, i, k1].astype("int32") * b[c, k0, j, k1].astype("int32"), axis=[k0, k1]),
    ...     wmma.WmmaShape(8, 8, 32), (8, 8), "gemm")
    >>> c.op.attrs["wmma_m"], c.op.attrs["unit_cols"]
    (8, 8)
    """
    attrs = {"wmma_m": shape.m, "wmma_n": shape.n, "wmma_k": shape.k, "unit_rows": unit[0], "unit_cols": unit[1]}
    return te.compute(shape_out, fcompute, name=name, tag=PACKED_GEMM_TAG, attrs=attrs)


def resolve_shape(
    operands: Sequence[te.Tensor],
    out_dtype: str,
    rows: int,
    red: int,
    cols: int,
    shape: Optional[wmma.WmmaShape] = None,
    names: str = "data and kernel",
) -> wmma.WmmaShape:
    """Check the operand and output types of a packed GEMM and return the WMMA shape it uses.

    ``shape`` defaults to the preferred shape that tiles ``rows x cols x red``.

    Raises
    ------
    ValueError
        For operands not sharing an integer tensor-core type, a non-int32
        output, or a shape that does not tile the sizes.

    Examples
    --------
    >>> x = te.placeholder((16, 64), "int8"); w = te.placeholder((32, 64), "int8")
    >>> resolve_shape([x, w], "int32", 16, 64, 32)
    WmmaShape(m=16, n=16, k=16)
    """
    dtypes = [t.dtype for t in operands]
    if len(set(dtypes)) != 1 or dtypes[0] not in wmma.WMMA_SHAPES:
        raise ValueError(f"{names} must share one of {sorted(wmma.WMMA_SHAPES)}, got {' and '.join(dtypes)}")
    if out_dtype != wmma.ACCUMULATOR_DTYPE:
        raise ValueError(f"out_dtype must be {wmma.ACCUMULATOR_DTYPE} for tensor cores, got {out_dtype!r}")
    if shape is None:
        fits = fitting_shapes(dtypes[0], rows, red, cols)
        if not fits:
            raise ValueError(f"no WMMA shape of {dtypes[0]} tiles batch={rows}, in={red}, out={cols}")
        shape = fits[0]
    if rows % shape.m or red % shape.k or cols % shape.n:
        raise ValueError(f"WMMA shape {shape.name} does not tile batch={rows}, in={red}, out={cols}")
    return shape


def choose_shape(
    cfg, dtype: str, rows: int, red: int, cols: int, packed_n: Optional[int] = None
) -> Tuple[wmma.WmmaShape, Tuple[int, int]]:
    """Define the ``wmma_m`` knob; return the chosen WMMA shape and the tiling unit.

    The knob offers every shape that tiles ``rows x cols x red`` (batch, output
    and input channels). A kernel pre-packed for tiles with ``packed_n``
    columns fixes the fallback choice, and a tuned config must agree with it.
    The unit is the largest candidate tile, so that the tiling knobs mean the
    same for every ``wmma_m``.

    Examples
    --------
    >>> from tvm import autotvm
    >>> cfg = autotvm.task.space.FallbackConfigEntity()
    >>> choose_shape(cfg, "int8", 32, 64, 64)
    (WmmaShape(m=16, n=16, k=16), (32, 32))
    """
    fits = fitting_shapes(dtype, rows, red, cols)
    if not fits:
        raise ValueError(f"no WMMA shape of {dtype} tiles batch={rows}, in={red}, out={cols}")
    cfg.define_knob("wmma_m", [s.m for s in fits])
    if cfg.is_fallback:
        preferred = next((s for s in fits if s.n == packed_n), fits[0])
        cfg["wmma_m"] = OtherOptionEntity(preferred.m)
    shape = wmma.shape_for(dtype, m=cfg["wmma_m"].val)
    if packed_n is not None and shape.n != packed_n:
        raise ValueError(f"config asks for WMMA {shape.name} but the kernel is packed for n={packed_n}")
    return shape, (max(s.m for s in fits), max(s.n for s in fits))


def define_knobs(cfg, rows: int, cols: int, k_tiles: int, unit: Sequence[int], bits: int = 8) -> None:
    """Define the tiling knobs for ``rows x cols`` outputs, ``k_tiles`` reduction tiles, ``bits``-bit operands.

    Examples
    --------
    >>> from tvm import autotvm
    >>> cfg = autotvm.task.space.FallbackConfigEntity()
    >>> define_knobs(cfg, 64, 256, 4, (16, 16))
    >>> cfg["tile_rows"].size, cfg["chunk"].val
    ([1, 2, 2], 2)
    """
    def ok(e) -> bool:
        return e.size[1] <= MAX_WARPS and e.size[2] <= MAX_TILES and e.size[1] * e.size[2] <= MAX_WARP_TILES

    cfg.define_split("tile_rows", rows // unit[0], num_outputs=3, filter=ok)
    cfg.define_split("tile_cols", cols // unit[1], num_outputs=3, filter=ok)
    cfg.define_knob("chunk", [c for c in CHUNKS if k_tiles % c == 0])
    cfg.define_knob("copy_lanes", copy_lanes(bits))
    cfg.define_knob("unroll_max_step", UNROLL_STEPS)
    cfg.define_knob("unroll_explicit", [0, 1])
    if cfg.is_fallback:
        # Two warps per dimension with two tiles each: 128 threads and a
        # moderate number of live fragments per warp.
        cfg.fallback_split("tile_rows", [-1, 2, 2])
        cfg.fallback_split("tile_cols", [-1, 2, 2])
        cfg["chunk"] = OtherOptionEntity(max(c for c in CHUNKS if k_tiles % c == 0 and c <= 2))
        cfg["copy_lanes"] = OtherOptionEntity(copy_lanes(bits)[-1])
        cfg["unroll_max_step"] = OtherOptionEntity(64)
        cfg["unroll_explicit"] = OtherOptionEntity(0)


def schedule(cfg, outs: Sequence[te.Tensor]) -> te.Schedule:
    """Schedule the fused group ending in ``outs`` that contains one packed GEMM stage.

    Examples
    --------
    >>> from tvm import autotvm
    >>> from tvm_tcutils.tensorcore.topi import dense
    >>> x = te.placeholder((16, 64), "int8"); w = te.placeholder((32, 64), "int8")
    >>> with tvm.target.Target("cuda -arch=sm_80"):  # lowering only: no GPU needed
    ...     cfg = autotvm.get_config()
    ...     out = dense.dense_template(cfg, x, w)
    ...     sched = schedule(cfg, [out])
    >>> lowered = str(tvm.lower(sched, [x, w, out]))
    >>> all(call in lowered for call in ("tvm_load_matrix_sync", "tvm_mma_sync", "tvm_store_matrix_sync"))
    True
    """
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    s = te.create_schedule([x.op for x in outs])
    gemm = _find_and_inline(s, outs)
    _schedule_gemm(cfg, s, gemm.output(0))
    for out in outs:
        if out.op != gemm:
            _schedule_elementwise(s, out)
    return s


def _find_and_inline(s: te.Schedule, outs: List[te.Tensor]) -> te.Operation:
    """Find the packed GEMM below ``outs`` and inline the element-wise stages in between.

    Explicit stack, no recursion: fused groups can be long chains.
    """
    output_ops = {out.op for out in outs}
    stack, seen, gemm = [out.op for out in outs], set(), None
    while stack:
        op = stack.pop()
        if op in seen or not isinstance(op, te.ComputeOp):
            continue
        seen.add(op)
        if op.tag == PACKED_GEMM_TAG:
            gemm = op
            continue
        if op not in output_ops:
            s[op].compute_inline()
        stack.extend(t.op for t in op.input_tensors)
    if gemm is None:
        raise ValueError(f"no stage tagged {PACKED_GEMM_TAG!r} among the inputs of {[o.op.name for o in outs]}")
    return gemm


def _inline_producers(s: te.Schedule, tensors: Sequence[te.Tensor]) -> None:
    """Inline the packing stages and every element-wise op Relay fused before them.

    They all become part of the cooperative shared-memory copies.
    """
    stack, seen = [t.op for t in tensors], set()
    while stack:
        op = stack.pop()
        if op in seen or not isinstance(op, te.ComputeOp):
            continue
        seen.add(op)
        s[op].compute_inline()
        stack.extend(t.op for t in op.input_tensors)


def _int_attr(op: te.ComputeOp, key: str) -> int:
    return int(op.attrs[key])


def _schedule_gemm(cfg, s: te.Schedule, out: te.Tensor) -> None:
    op = out.op
    shape = wmma.WmmaShape(_int_attr(op, "wmma_m"), _int_attr(op, "wmma_n"), _int_attr(op, "wmma_k"))
    unit = (_int_attr(op, "unit_rows"), _int_attr(op, "unit_cols"))
    a_packed, b_packed = op.input_tensors
    dtype = a_packed.dtype
    lead, (rb, cb, mi, ni) = op.axis[:-4], op.axis[-4:]
    define_knobs(cfg, int(rb.dom.extent) * shape.m, int(cb.dom.extent) * shape.n,
                 int(op.reduce_axis[-2].dom.extent), unit, tvm.runtime.DataType(dtype).bits)
    warps_r = cfg["tile_rows"].size[1]
    warps_c = cfg["tile_cols"].size[1]
    # Knob sizes count the largest tiles; a smaller WMMA tile gives more tiles per warp.
    tiles_r = cfg["tile_rows"].size[2] * unit[0] // shape.m
    tiles_c = cfg["tile_cols"].size[2] * unit[1] // shape.n
    chunk = cfg["chunk"].val

    a_shared = s.cache_read(a_packed, "shared", [op])
    b_shared = s.cache_read(b_packed, "shared", [op])
    a_frag = s.cache_read(a_shared, wmma.FRAGMENT_SCOPES["a"], [op])
    b_frag = s.cache_read(b_shared, wmma.FRAGMENT_SCOPES["b"], [op])
    acc = s.cache_write(out, wmma.FRAGMENT_SCOPES["acc"])
    _inline_producers(s, [a_packed, b_packed])

    # Output: grid and warps; each warp stores its fragments.
    stage = s[out]
    rb_rest, rb_t = stage.split(rb, factor=tiles_r)
    rb_o, rb_w = stage.split(rb_rest, factor=warps_r)
    cb_rest, cb_t = stage.split(cb, factor=tiles_c)
    cb_o, cb_w = stage.split(cb_rest, factor=warps_c)
    stage.reorder(*lead, rb_o, cb_o, rb_w, cb_w, rb_t, cb_t, mi, ni)
    if lead:
        stage.bind(stage.fuse(*lead), te.thread_axis("blockIdx.z"))
    stage.bind(rb_o, te.thread_axis("blockIdx.x"))
    stage.bind(cb_o, te.thread_axis("blockIdx.y"))
    thread_y, thread_z = te.thread_axis("threadIdx.y"), te.thread_axis("threadIdx.z")
    stage.bind(rb_w, thread_y)
    stage.bind(cb_w, thread_z)
    stage.tensorize(mi, wmma.store_matrix(shape, "global"))

    # Accumulation: per warp, over the reduction in chunks.
    s[acc].compute_at(stage, cb_w)
    acc_axes, red = s[acc].op.axis, s[acc].op.reduce_axis
    kb_o, kb_i = s[acc].split(red[-2], factor=chunk)
    s[acc].reorder(*red[:-2], kb_o, kb_i, *acc_axes[-4:], red[-1])
    s[acc].tensorize(acc_axes[-2], wmma.mma(shape, dtype))
    outer = red[0] if len(red) > 2 else kb_o
    s[acc].pragma(outer, "auto_unroll_max_step", cfg["unroll_max_step"].val)
    s[acc].pragma(outer, "unroll_explicit", cfg["unroll_explicit"].val)

    for frag, operand in ((a_frag, "a"), (b_frag, "b")):
        s[frag].compute_at(s[acc], kb_i)
        s[frag].tensorize(s[frag].op.axis[-2], wmma.load_matrix(shape, operand, dtype, "shared"))

    # Shared staging: all threads of the block copy the chunk cooperatively.
    thread_x = te.thread_axis("threadIdx.x")
    lanes = cfg["copy_lanes"].val  # divides k (16 int8 or 32 int4 elements)
    for shared in (a_shared, b_shared):
        s[shared].compute_at(s[acc], kb_o)
        fused = s[shared].fuse(*s[shared].op.axis)
        rest, vector = s[shared].split(fused, factor=lanes)
        s[shared].vectorize(vector)
        rest, lane = s[shared].split(rest, factor=WARP_SIZE)
        rest, warp_r = s[shared].split(rest, factor=warps_r)
        _, warp_c = s[shared].split(rest, factor=warps_c)
        s[shared].bind(lane, thread_x)
        s[shared].bind(warp_r, thread_y)
        s[shared].bind(warp_c, thread_z)


def _schedule_elementwise(s: te.Schedule, out: te.Tensor) -> None:
    stage = s[out]
    fused = stage.fuse(*stage.op.axis)
    block, thread = stage.split(fused, factor=UNPACK_THREADS)
    stage.bind(block, te.thread_axis("blockIdx.x"))
    stage.bind(thread, te.thread_axis("threadIdx.x"))
