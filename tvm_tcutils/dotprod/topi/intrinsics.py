"""TE tensor intrinsics built from a :class:`~tvm_tcutils.dotprod.isa.DotProductISA`.

One tile is ``out[l] += sum_{k<4} data[k] * kernel[l, k]`` for ``l < lanes``:
four data bytes shared by all lanes (they are broadcast into one register) and
a ``lanes x 4`` kernel block stored contiguously. Every ISA goes through
:func:`dot_product_intrin`; only the emitter differs.

``mode="llvm"`` emits the ISA's LLVM intrinsic; ``mode="extern"`` emits a call
to the variant's C helper (``acc, data, kernel`` pointers), for loop nests that
are printed as C and compiled by another compiler (Hexagon emulation). A
target whose code TVM prints as C (kind ``c``, :data:`SOURCE_KINDS`) cannot hold
LLVM intrinsics, so there ``"llvm"`` -- every schedule's default -- means
``"extern"`` (:func:`target_mode`): a whole model built by ``relay.build`` for
``c -keys=hexagon,cpu`` gets the C-helper tiles without a schedule knowing.
"""
from __future__ import annotations

import functools
from typing import List, Tuple

from ..._tvm import tvm
from tvm import te, tir

from ..isa import DotProductISA
from ..isa.base import reinterpret
from .common import flipped

MODES = ("llvm", "extern")

#: Target kinds whose code TVM prints as source: no LLVM intrinsic can appear in it.
SOURCE_KINDS = ("c",)


def target_mode(mode: str = "llvm", target=None) -> str:
    """The tile code ``mode`` becomes on ``target`` (default: the current target).

    ``"llvm"`` on a :data:`SOURCE_KINDS` target is ``"extern"``: TVM's C backend cannot print
    an LLVM intrinsic, and the schedules reach the intrinsic through Relay's strategies with
    their default mode, so the target decides. Every other case is ``mode`` unchanged.

    Examples
    --------
    >>> import tvm
    >>> target_mode("llvm", tvm.target.Target("c -keys=hexagon,cpu")), target_mode("llvm", "hexagon")
    ('extern', 'llvm')
    >>> with tvm.target.Target("c -keys=hexagon,cpu"):
    ...     target_mode()
    'extern'
    """
    if target is None:
        target = tvm.target.Target.current(allow_none=True)
    elif isinstance(target, str):
        target = tvm.target.Target(target)
    if mode == "llvm" and target is not None and target.kind.name in SOURCE_KINDS:
        return "extern"
    return mode


def tile_compute(isa: DotProductISA, data_dtype: str, kernel_dtype: str):
    """The TE computation of one tile: (data, kernel, out) tensors.

    ``data_dtype`` is the data placeholder's (``isa.wide_data`` for widened data); a
    ``kernel_dtype`` of ``isa.wide_kernel`` gives the kernel block as ``(4 / g, lanes, g)``
    with ``g = isa.wide_group``.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> data, kernel, out = tile_compute(X86_VNNI, "uint8", "int8")
    >>> [int(d) for d in kernel.shape], out.dtype
    ([16, 4], 'int32')
    """
    lanes, red, group = isa.lanes, isa.reduce, isa.kernel_group(kernel_dtype)
    data = te.placeholder((red,), dtype=data_dtype, name="dot_data")
    k = te.reduce_axis((0, red), name="k")
    if group == red:
        kernel = te.placeholder((lanes, red), dtype=kernel_dtype, name="dot_kernel")
        def tap(lane):
            return kernel[lane, k]
    else:  # a widened kernel: red // group blocks of lanes x group
        kernel = te.placeholder((red // group, lanes, group), dtype=kernel_dtype, name="dot_kernel")
        def tap(lane):
            return kernel[k // group, lane, k % group]
    out = te.compute(
        (lanes,), lambda lane: te.sum(data[k].astype("int32") * tap(lane).astype("int32"), axis=k), name="dot_out"
    )
    return data, kernel, out


def dot_product_intrin(isa: DotProductISA, data_dtype: str, kernel_dtype: str, mode: str = "llvm",
                       wide: bool = False):
    """The tensor intrinsic replacing one ``lanes x 4`` tile.

    Parameters
    ----------
    isa : DotProductISA
        The instruction description.
    data_dtype, kernel_dtype : str
        Operand dtypes; must be a native variant of ``isa`` (``kernel_dtype`` may be
        ``isa.wide_kernel``: a kernel packed widened).
    mode : {"llvm", "extern"}
        Emit the LLVM intrinsic, or a call to the variant's C helper; ``"llvm"`` under a
        C-source target is ``"extern"`` (:func:`target_mode`).
    wide : bool
        The data tile holds ``data_dtype`` values already widened to ``isa.wide_data``.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> intrin = dot_product_intrin(X86_VNNI, "uint8", "int8")
    >>> [t.dtype for t in intrin.inputs], intrin.op.output(0).shape  # 16 int32 lanes per call
    (['uint8', 'int8'], [16])
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    # Resolved before the cache: the cached intrinsic depends on the mode, not on the target.
    return _dot_product_intrin(isa, str(data_dtype), str(kernel_dtype), target_mode(mode), wide)


@functools.lru_cache(maxsize=None)
def _dot_product_intrin(isa: DotProductISA, data_dtype: str, kernel_dtype: str, mode: str, wide: bool):
    """:func:`dot_product_intrin` for a resolved ``mode`` (cached: one intrinsic per argument tuple)."""
    variant = isa.variant(data_dtype, kernel_dtype)
    if variant is None:
        native = [(v.data_dtype, v.kernel_dtype) for v in isa.variants]
        raise ValueError(
            f"{isa.name} has no ({data_dtype}, {kernel_dtype}) dot product; native pairs: {native}"
        )
    if mode == "extern" and not variant.extern:
        raise ValueError(f"{isa.name} ({data_dtype}, {kernel_dtype}) has no C helper for mode='extern'")
    if wide and (mode != "llvm" or not isa.wide_data):
        raise ValueError(f"{isa.name} in mode {mode!r} takes no widened data")
    lanes, red, nbytes = isa.lanes, isa.reduce, isa.vector_bytes
    group = isa.kernel_group(kernel_dtype)
    if group != red and mode != "llvm":
        raise ValueError(f"{isa.name} in mode {mode!r} takes no widened kernel")
    tile_dtype = isa.wide_data if wide else data_dtype
    data, kernel, out = tile_compute(isa, tile_dtype, kernel_dtype)
    a_buf = tir.decl_buffer(data.shape, tile_dtype, "a_buf", offset_factor=1, strides=[1])
    b_strides = [red, 1] if group == red else [lanes * group, group, 1]
    b_buf = tir.decl_buffer(kernel.shape, kernel_dtype, "b_buf", offset_factor=1, strides=b_strides)
    c_buf = tir.decl_buffer(out.shape, "int32", "c_buf", offset_factor=1, strides=[1])

    def intrin_func(ins, outs):
        a, b = ins
        (c,) = outs

        def make(kind: str):
            builder = tir.ir_builder.create()
            if mode == "extern":
                if kind != "update":
                    builder.emit(tir.call_extern("int32", "tcu_zero_i32", c.access_ptr("w"), lanes))
                if kind != "reset":
                    builder.emit(
                        tir.call_extern(
                            "int32", variant.extern, c.access_ptr("rw"), a.access_ptr("r"), b.access_ptr("r")
                        )
                    )
                return builder.get()
            zero = tir.Broadcast(tir.const(0, "int32"), lanes)
            if kind == "reset":
                builder.emit(c.vstore([0], zero))
                return builder.get()
            if wide:
                data_vec = isa.wide_loader(a)
            else:
                # The four data bytes are read as one int32 and broadcast to all lanes.
                word = reinterpret(a.vload([0], f"{data_dtype}x{red}"), "int32")
                data_vec = reinterpret(tir.Broadcast(word, lanes), f"{data_dtype}x{nbytes}")
            if group == red:
                kernel_vec = b.vload([0, 0], f"{kernel_dtype}x{nbytes}")
            else:
                kernel_vec = tuple(b.vload([p, 0, 0], f"{kernel_dtype}x{lanes * group}") for p in range(red // group))
            acc = zero if kind == "body" else c.vload([0], f"int32x{lanes}")
            builder.emit(c.vstore([0], isa.emit(variant, acc, data_vec, kernel_vec)))
            return builder.get()

        return make("body"), make("reset"), make("update")

    return te.decl_tensor_intrin(
        out.op, intrin_func, binds={data: a_buf, kernel: b_buf, out: c_buf}, default_buffer_params={}
    )


#: Bytes one AVX-512BW ``vpsadbw`` sums (:func:`byte_sum_intrin`).
BYTE_SUM_WIDTH = 64


@functools.lru_cache(maxsize=None)
def byte_sum_intrin(dtype: str):
    """The sum of 64 bytes (``uint8`` or ``int8``) into an int32, with AVX-512BW's ``vpsadbw``.

    For the row sums a flipped 8-bit product needs (``batch_matmul``'s correction): ``vpsadbw``
    against zero sums eight bytes into each of eight 64-bit lanes, twice as fast as widening every
    byte to int32 (0.95 against 2.08 us for 4 x 128 rows of 128 bytes). ``int8`` is summed as
    ``uint8`` after flipping the sign bits (``v ^ 0x80`` is ``v + 128``), less ``128 * 64``.

    Examples
    --------
    >>> x = te.placeholder((2, 128), "int8", name="x")
    >>> k = te.reduce_axis((0, 128), name="k")
    >>> sums = te.compute((2,), lambda r: te.sum(x[r, k].astype("int32"), axis=k), name="sums")
    >>> s = te.create_schedule(sums.op)
    >>> k_o, k_i = s[sums].split(sums.op.reduce_axis[0], factor=BYTE_SUM_WIDTH)
    >>> s[sums].tensorize(k_i, byte_sum_intrin("int8"))
    >>> "vpsadbw" in tvm.build(s, [x, sums], "llvm -mcpu=skylake-avx512").get_source("asm")
    True
    """
    if dtype not in ("uint8", "int8"):
        raise ValueError(f"dtype must be uint8 or int8 for a byte sum, got {dtype!r}")
    width = BYTE_SUM_WIDTH
    data = te.placeholder((width,), dtype, name="bytes")
    k = te.reduce_axis((0, width), name="k")
    out = te.compute((1,), lambda _: te.sum(data[k].astype("int32"), axis=k), name="byte_sum")
    a_buf = tir.decl_buffer(data.shape, dtype, "a_buf", offset_factor=1, strides=[1])
    c_buf = tir.decl_buffer(out.shape, "int32", "c_buf", offset_factor=1, strides=[1])

    def intrin_func(ins, outs):
        (a,), (c,) = ins, outs

        def make(kind: str):
            builder = tir.ir_builder.create()
            if kind == "reset":
                builder.emit(c.vstore([0], tir.const(0, "int32")))
                return builder.get()
            raw = a.vload([0], f"{dtype}x{width}")
            if dtype == "int8":
                raw = raw ^ tir.Broadcast(tir.const(-128, "int8"), width)
            sad = tir.call_llvm_pure_intrin(
                f"int64x{width // 8}", "llvm.x86.avx512.psad.bw.512", tir.const(2, "uint32"),
                reinterpret(raw, f"int8x{width}"), tir.Broadcast(tir.const(0, "int8"), width))
            total = tir.call_llvm_pure_intrin("int64", f"llvm.vector.reduce.add.v{width // 8}i64",
                                              tir.const(1, "uint32"), sad).astype("int32")
            if dtype == "int8":
                total = total - tir.const(128 * width, "int32")
            builder.emit(c.vstore([0], total if kind == "body" else c.vload([0], "int32") + total))
            return builder.get()

        return make("body"), make("reset"), make("update")

    return te.decl_tensor_intrin(out.op, intrin_func, binds={data: a_buf, out: c_buf}, default_buffer_params={})


#: 32-bit words per side of the block :func:`word_transpose_intrin` transposes in registers.
WORD_BLOCK = 16


def _per_quarter(pick) -> List[int]:
    """A two-source word shuffle (indices into ``a ++ b``) that works within each 128-bit quarter:
    ``pick(q, e)`` is the source of word ``e`` of quarter ``q``."""
    return [pick(q, e) for q in range(4) for e in range(4)]


#: (low, high) word shuffles of two int32x16 vectors, each the one AVX-512 instruction LLVM selects for it
#: without an index register: ``vpunpck[lh]dq``, ``vpunpck[lh]qdq`` and ``vshufi32x4`` (imm 0x88 / 0xdd).
UNPACK_WORDS = (_per_quarter(lambda q, e: 4 * q + e // 2 + 16 * (e % 2)),
                _per_quarter(lambda q, e: 4 * q + 2 + e // 2 + 16 * (e % 2)))
UNPACK_PAIRS = (_per_quarter(lambda q, e: 4 * q + e % 2 + 16 * (e // 2)),
                _per_quarter(lambda q, e: 4 * q + 2 + e % 2 + 16 * (e // 2)))
PICK_QUARTERS = ([w + 4 * q + 16 * h for h in (0, 1) for q in (0, 2) for w in range(4)],
                 [w + 4 * q + 16 * h for h in (0, 1) for q in (1, 3) for w in range(4)])


def transpose_stages() -> List[List[Tuple[Tuple[int, int], Tuple[int, int], Tuple[List[int], List[int]]]]]:
    """The 4 stages of 16 two-source shuffles that transpose 16 vectors of 16 words: per stage, entries
    ``((a, b), (lo, hi), (low, high))`` make vectors ``lo`` and ``hi`` of the next stage from vectors ``a``
    and ``b`` of this one. Words are interleaved within quarters twice (by 1, then 2 words), then quarters
    are picked twice (pairs 4, then 8 vectors apart): every shuffle one single-cycle instruction, where a
    permutation by vector-index bits takes ``vpermt2d`` and its index loads.

    Examples
    --------
    >>> rows = [[(v, p) for p in range(16)] for v in range(16)]
    >>> for stage in transpose_stages():
    ...     new = list(rows)
    ...     for (a, b), (lo, hi), (low, high) in stage:
    ...         both = rows[a] + rows[b]
    ...         new[lo], new[hi] = [both[i] for i in low], [both[i] for i in high]
    ...     rows = new
    >>> rows == [[(p, v) for p in range(16)] for v in range(16)]
    True
    """
    return [
        [((2 * i, 2 * i + 1), (2 * i, 2 * i + 1), UNPACK_WORDS) for i in range(8)],
        [((4 * j + a, 4 * j + a + 2), (4 * j + 2 * a, 4 * j + 2 * a + 1), UNPACK_PAIRS)
         for j in range(4) for a in (0, 1)],
        [((g + k, g + k + 4), (g + k, g + k + 4), PICK_QUARTERS) for g in (0, 8) for k in range(4)],
        [((k, k + 8), (k, k + 8), PICK_QUARTERS) for k in range(8)],
    ]


@functools.lru_cache(maxsize=None)
def word_transpose_intrin(src_dtype: str, dst_dtype: str):
    """Pack 16 rows of 16 four-byte words into 16 blocks of 16 words (``out[c, l, s] = rows[l, 4c + s]``,
    the sign bit flipped where ``dst_dtype`` differs), transposed in 512-bit registers.

    The dot product's ``(N/16, K/4, 16, 4)`` layout of an activation (``batch_matmul``'s ``y``) is such a
    transpose per 16 rows; element by element it is one 4-byte load and store per word (4.4-5.5 us of
    BERT-base's 38 us attention product on Zen 5). Here a block is 16 row loads, 64 two-source shuffles
    (:func:`transpose_stages`) and 16 stores.

    Examples
    --------
    >>> y = te.placeholder((32, 64), "uint8", name="y")
    >>> from tvm_tcutils.dotprod.topi.common import flipped
    >>> p = te.compute((2, 16, 16, 4), lambda o, c, l, s: flipped(y[o * 16 + l, c * 4 + s], "uint8", "int8"),
    ...                name="p")
    >>> s = te.create_schedule(p.op)
    >>> s[p].tensorize(p.op.axis[1], word_transpose_intrin("uint8", "int8"))
    >>> f = tvm.build(s, [y, p], "llvm")  # plain shuffles: any CPU; AVX-512 makes them unpacks and vshufi32x4
    >>> import numpy as np
    >>> a = np.random.default_rng(0).integers(0, 256, (32, 64)).astype("uint8")
    >>> out = tvm.nd.empty((2, 16, 16, 4), "int8"); f(tvm.nd.array(a), out)
    >>> ref = (a.reshape(2, 16, 16, 4).transpose(0, 2, 1, 3).astype("int32") - 128).astype("int8")
    >>> bool((out.numpy() == ref).all())
    True
    """
    block, width = WORD_BLOCK, 4 * WORD_BLOCK
    rows = te.placeholder((block, width), src_dtype, name="rows")
    out = te.compute((block, block, 4), lambda c, r, s: flipped(rows[r, c * 4 + s], src_dtype, dst_dtype),
                     name="word_transpose")
    r_buf = tir.decl_buffer(rows.shape, src_dtype, "r_buf", offset_factor=1, strides=[te.var("row"), 1])
    o_buf = tir.decl_buffer(out.shape, dst_dtype, "o_buf", offset_factor=1, strides=[te.var("blk"), 4, 1])

    def intrin_func(ins, outs):
        (src,), (dst,) = ins, outs
        builder = tir.ir_builder.create()
        vectors = []
        for line in range(block):
            raw = src.vload([line, 0], f"{src_dtype}x{width}")
            if src_dtype != dst_dtype:  # v -/+ 128 is v ^ 0x80
                raw = raw ^ tir.Broadcast(tir.const(-128 if src_dtype == "int8" else 128, src_dtype), width)
            vectors.append(reinterpret(raw, f"int32x{block}"))
        for stage in transpose_stages():
            after = list(vectors)
            for (a, b), (lo, hi), (low, high) in stage:
                pair = [vectors[a], vectors[b]]
                after[lo] = tir.Shuffle(pair, [tir.const(i, "int32") for i in low])
                after[hi] = tir.Shuffle(pair, [tir.const(i, "int32") for i in high])
            vectors = after
        for word in range(block):
            builder.emit(dst.vstore([word, 0, 0], reinterpret(vectors[word], f"{dst_dtype}x{width}")))
        return builder.get()

    return te.decl_tensor_intrin(out.op, intrin_func, binds={rows: r_buf, out: o_buf}, default_buffer_params={})
