"""Tile programs for a :class:`~tvm_tcutils.dotprod.isa.x86_amx.TileISA`, in two forms with one meaning.

A kernel writes its tile program once against :class:`Tiles` (configure, zero, load, multiply, store on
numbered tile registers). The *real* form emits the LLVM intrinsics (``ldtilecfg``, ``tileloadd64``,
``tdpbusd``, ``tilestored64``, ...). The *reference* form (:func:`reference_tiles`) emits plain TIR over
a tile register file in memory with the same semantics -- each register ``rows`` x ``row_bytes`` bytes,
``B`` tiles in VNNI-4 rows, int32 accumulation -- so that the kernels' loops, packing, padding, partial
tiles and epilogues are checked bit-exact on any x86 CPU, AMX or not.

Two facts of the machine shape the real form. The tile configuration is per thread and other libraries
in the process (onnxruntime, oneDNN) load their own, so every tile program loads its own at its start --
the kernels run one program per parallel task. And the process must hold the tile state
(:mod:`tvm_tcutils.dotprod.amx`), so the program's first run in a loaded module requests it (a flag in
the module's data keeps that to once) and fails with TVM's error, not SIGILL, where Linux refuses.
"""
# reference_tiles / in_reference_form live with the machine's side (..amx), which decides what may run
# here; they are named here too, beside the forms they choose.
from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Sequence, Tuple

from ..._tvm import tvm
from tvm import tir

from ..amx import ARCH_REQ_XCOMP_PERM, SYS_ARCH_PRCTL, XFEATURE_XTILEDATA, in_reference_form, reference_tiles
from ..isa.base import DotVariant
from ..isa.x86_amx import CONFIG, LOAD, SAVE_CONFIG, STORE, ZERO, TileISA
from ..pipeline import prefetch_call

__all__ = ["Tiles", "TileMemory", "config_words", "matrix", "vnni_block", "run_steps", "reference_tiles",
           "in_reference_form"]


def config_words(isa: TileISA, shapes: Sequence[Tuple[int, int]]) -> List[int]:
    """The 64-byte tile configuration as eight little-endian 64-bit words: palette, then each register's
    bytes per row (16-bit) and rows (8-bit); ``shapes[t] = (rows, bytes per row)``.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa.x86_amx import X86_AMX
    >>> words = config_words(X86_AMX, [(16, 64)] * 2)
    >>> hex(words[0]), hex(words[2]), hex(words[6])
    ('0x1', '0x400040', '0x1010')
    """
    if len(shapes) > isa.tiles:
        raise ValueError(f"{len(shapes)} tiles configured; {isa.name} has {isa.tiles}")
    raw = bytearray(64)
    raw[0] = isa.palette
    for t, (rows, colsb) in enumerate(shapes):
        if not (0 < rows <= isa.rows and 0 < colsb <= isa.row_bytes):
            raise ValueError(f"tile {t}: {rows} x {colsb} bytes exceeds {isa.rows} x {isa.row_bytes}")
        raw[16 + 2 * t: 18 + 2 * t] = colsb.to_bytes(2, "little")
        raw[48 + t] = rows
    return [int.from_bytes(raw[8 * i: 8 * i + 8], "little") for i in range(8)]


@dataclasses.dataclass(frozen=True)
class TileMemory:
    """Where one tile lives in memory: ``pointer`` and ``stride`` (bytes between rows) for the real form,
    ``element(row, column)`` -> ``(buffer, indices)`` of one element for the reference form (columns in
    elements of the buffer's dtype)."""

    pointer: Callable[[str], tir.PrimExpr]
    stride: tir.PrimExpr
    element: Callable[[tir.PrimExpr, tir.PrimExpr], Tuple[tir.Buffer, list]]


def _call(name: str, *args) -> tir.PrimExpr:
    # The tile intrinsics return nothing; TVM takes any return type for a non-overloaded intrinsic.
    return tir.call_llvm_intrin("int32", name, tir.const(0, "uint32"), *args)


def _int64(value) -> tir.PrimExpr:
    return tir.const(value, "int64") if isinstance(value, int) else value.astype("int64")


def _reg(t: int) -> tir.PrimExpr:
    return tir.const(t, "uint8")


class Tiles:
    """A tile program being written into an IR builder ``ib`` for ``isa`` and one dtype ``variant``;
    ``shapes[t] = (rows, bytes per row)`` of each tile register used."""

    def __init__(self, ib, isa: TileISA, variant: DotVariant, shapes: Sequence[Tuple[int, int]],
                 ask_state: bool = True):
        # ask_state=False where the program asked for the tile state already (a SavedConfig first).
        self.ib, self.isa, self.variant, self.shapes = ib, isa, variant, list(shapes)
        self.reference = in_reference_form()
        words = config_words(isa, self.shapes)
        if self.reference:
            n = len(self.shapes)
            self.acc = ib.allocate("int32", n * isa.rows * isa.columns, name="tile_acc", scope="global")
            self.bytes = ib.allocate("int8", n * isa.rows * isa.row_bytes, name="tile_bytes", scope="global")
            return
        if ask_state:
            request_tile_state(ib)
        cfg = ib.allocate("uint64", 8, name="tile_config", scope="local")
        for i, word in enumerate(words):
            cfg[i] = tir.const(word, "uint64")
        ib.emit(_call(CONFIG, tir.call_intrin("handle", "tir.address_of", tir.BufferLoad(cfg._buffer, [0]))))

    # -- operations -------------------------------------------------------------------------------
    def zero(self, t: int) -> None:
        """Tile ``t`` := 0."""
        if not self.reference:
            self.ib.emit(_call(ZERO, _reg(t)))
            return
        cols = self.isa.columns
        with self.ib.for_range(0, self.isa.rows * cols, name="z") as e:
            self.acc[t * self.isa.rows * cols + e] = tir.const(0, "int32")

    def load(self, t: int, memory: TileMemory) -> None:
        """Tile ``t`` := its configured rows x bytes from ``memory`` (8-bit data)."""
        rows, colsb = self.shapes[t]
        if not self.reference:
            self.ib.emit(_call(LOAD, _reg(t), memory.pointer("r"), _int64(memory.stride)))
            return
        with self.ib.for_range(0, rows, name="lr") as r:
            with self.ib.for_range(0, colsb, name="lc") as c:
                buf, idx = memory.element(r, c)
                value = tir.BufferLoad(buf, idx)
                if value.dtype != "int8":
                    value = tir.reinterpret("int8", value)
                self.bytes[(t * self.isa.rows + r) * self.isa.row_bytes + c] = value

    def multiply(self, c: int, a: int, b: int) -> None:
        """Tile ``c`` += tile ``a`` (rows x 4k values) times tile ``b`` (k rows of VNNI-4 columns)."""
        if not self.reference:
            self.ib.emit(_call(self.variant.intrinsic, _reg(c), _reg(a), _reg(b)))
            return
        isa, ib = self.isa, self.ib
        rows, a_bytes = self.shapes[a]
        k_rows, b_bytes = self.shapes[b]
        if a_bytes != 4 * k_rows:
            raise ValueError(f"tile {a} has {a_bytes} bytes a row; tile {b} has {k_rows} rows of 4")

        def byte(tile, row, col, dtype):
            value = self.bytes[(tile * isa.rows + row) * isa.row_bytes + col]
            return (tir.reinterpret("uint8", value) if dtype == "uint8" else value).astype("int32")

        with ib.for_range(0, rows, name="m") as m:
            with ib.for_range(0, b_bytes // 4, name="n") as n:
                total = tir.const(0, "int32")
                with ib.for_range(0, k_rows, name="k") as k:
                    for q in range(4):
                        total = total + byte(a, m, 4 * k + q, self.variant.data_dtype) * byte(
                            b, k, 4 * n + q, self.variant.kernel_dtype)
                    index = (c * isa.rows + m) * isa.columns + n
                    self.acc[index] = self.acc[index] + total

    def prefetch(self, rows: int, memory: TileMemory) -> None:
        """Hint the caches to fetch the first line of each of ``rows`` rows of ``memory`` (a tile loaded
        later); nothing in the reference form."""
        if self.reference:
            return
        for r in range(rows):
            self.ib.emit(prefetch_call(tir.BufferLoad(*memory.element(r, 0))))

    def store(self, t: int, memory: TileMemory) -> None:
        """``memory`` (int32) := tile ``t``'s configured rows x bytes."""
        rows, colsb = self.shapes[t]
        if not self.reference:
            self.ib.emit(_call(STORE, _reg(t), memory.pointer("w"), _int64(memory.stride)))
            return
        with self.ib.for_range(0, rows, name="sr") as r:
            with self.ib.for_range(0, colsb // 4, name="sc") as col:
                buf, idx = memory.element(r, col)
                self.ib.emit(tir.BufferStore(buf, self.acc[(t * self.isa.rows + r) * self.isa.columns + col], idx))


def matrix(buffer: tir.Buffer, row0, col0, element_bytes: int = 1) -> TileMemory:
    """The tile at ``(row0, col0)`` of the last two axes of ``buffer`` (leading axes of extent 1, as a
    batch's slice binds; the row stride is the second-last axis' stride).

    Examples
    --------
    >>> b = tvm.tir.decl_buffer((32, 64), "uint8", strides=[64, 1])
    >>> int(matrix(b, 16, 0).stride)
    64
    """
    lead = len(buffer.shape) - 2
    stride = buffer.strides[lead] if buffer.strides else buffer.shape[lead + 1]
    return TileMemory(
        pointer=lambda access: buffer.access_ptr(access, offset=row0 * stride + col0),
        stride=stride * element_bytes,
        element=lambda r, c: (buffer, [0] * lead + [row0 + r, col0 + c]),
    )


def vnni_block(buffer: tir.Buffer, block, quad0, isa: TileISA) -> TileMemory:
    """The ``B`` tile of a weight packed ``(N / cols, K / 4, cols, 4)`` (leading axes of extent 1 allowed):
    block ``block``'s quads from ``quad0``, each quad row ``cols x 4`` contiguous bytes (the dot-product
    kernels' ``NC{L}n4c``).

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa.x86_amx import X86_AMX
    >>> w = tvm.tir.decl_buffer((2, 32, 16, 4), "int8")
    >>> int(vnni_block(w, 1, 16, X86_AMX).stride)
    64
    """
    lead = len(buffer.shape) - 4
    block_stride = buffer.strides[lead] if buffer.strides else buffer.shape[lead + 1] * isa.row_bytes
    return TileMemory(
        pointer=lambda access: buffer.access_ptr(access, offset=block * block_stride + quad0 * isa.row_bytes),
        stride=tir.const(isa.row_bytes, "int64"),
        element=lambda r, c: (buffer, [0] * lead + [block, quad0 + r, tvm.tir.indexdiv(c, 4),
                                                    tvm.tir.indexmod(c, 4)]),
    )


def request_tile_state(ib) -> None:
    """Request the tile state the first time a module runs a tile program (a flag in the module's
    data: racing threads both ask, which is harmless); fail with TVM's error where Linux refuses."""
    flag = tir.Var("tile_state_asked", tvm.ir.PointerType(tvm.ir.PrimType("int32")))
    done = tir.decl_buffer((1,), "int32", name="tile_state_asked", data=flag)
    asked = tir.call_extern("int64", "syscall", tir.const(SYS_ARCH_PRCTL, "int64"),
                            tir.const(ARCH_REQ_XCOMP_PERM, "int64"), tir.const(XFEATURE_XTILEDATA, "int64"))
    grant = tir.IfThenElse(
        tir.BufferLoad(done, [0]) == 0,
        tir.SeqStmt([
            tir.AssertStmt(asked == tir.const(0, "int64"),
                           tir.StringImm("tvm_tcutils: Linux refused this process the AMX tile state "
                                         "(arch_prctl ARCH_REQ_XCOMP_PERM); build for a target without "
                                         "amx-int8, or set TCUTILS_AMX=0 when building"),
                           tir.Evaluate(0)),
            tir.BufferStore(done, tir.const(1, "int32"), [0]),
        ]),
        None,
    )
    ib.emit(tir.LetStmt(flag, tir.call_intrin("handle", "tir.tvm_static_handle"), grant))


class SavedConfig:
    """The calling thread's tile configuration, stored at a tile program's start and loaded back at its end.

    Other libraries in the process keep their own configuration loaded between their calls: onnxruntime's
    AMX kernels load theirs once a thread, so a thread of theirs (the caller's, which runs TVM's first
    parallel task too) that found ours in place -- a tile of 0 rows among them -- died with SIGILL. A
    thread without one stores zeros, and loading those back releases the tiles again. Nothing in the
    reference form."""

    def __init__(self, ib):
        self.ib, self.words = ib, None
        if in_reference_form():
            return
        request_tile_state(ib)
        self.words = ib.allocate("uint64", 8, name="caller_tile_config", scope="local")
        ib.emit(_call(SAVE_CONFIG, self._address()))

    def _address(self) -> tir.PrimExpr:
        return tir.call_intrin("handle", "tir.address_of", tir.BufferLoad(self.words._buffer, [0]))

    def restore(self) -> None:
        if self.words is not None:
            self.ib.emit(_call(CONFIG, self._address()))


#: Attribute keys around each whole step's tile stores (values: its strip, its step), where
#: :mod:`tvm_tcutils.dotprod.tile_epilogue` runs the step's share of the epilogue; ignored elsewhere.
STEP_STRIP, STEP_INDEX = "tcutils_tile_step_strip", "tcutils_tile_step_index"


def run_steps(ib, isa: TileISA, variant: DotVariant, tile_rows: Sequence[int], reduction: Sequence[int],
              tile_a: int, tile_b: int, groups: int, weight_rows: int,
              data: Callable[..., TileMemory], weights: Callable[..., TileMemory],
              outputs: Callable[..., TileMemory], mark_steps: bool = False) -> None:
    """Write one task's tile program: ``groups`` strips of ``tile_b`` weight tiles by data tiles whose rows
    are ``tile_rows`` (tile ``g`` has ``tile_rows[g]``), in steps of ``tile_a`` data tiles; each step zeroes
    its accumulators, sums every point of the ``reduction`` loops (their extents) and stores once.

    ``data(g, *ks)``, ``weights(column, *ks)`` and ``outputs(g, column)`` say where data tile ``g``, the
    weight tile of a strip's ``column`` (its first int32 column) and an accumulator live, ``ks`` the
    reduction loops' variables; ``weight_rows`` is a weight tile's row count. Registers: accumulators
    ``tile_a x tile_b``, then the data tiles, then the weight tiles. Strips run outermost, so a strip's
    weights serve every step while in L1. The tiles left after whole steps of equal tiles (fewer, or a
    last one of fewer rows) run with a second configuration. A reduction of one point (one tile of
    depth) loads a strip's weight tiles once, before its steps; a longer one asks the L1 cache for the
    weight tiles ``isa.prefetch_ahead`` points ahead at each point. ``mark_steps``: the stores of each
    step (the tail's last) sit in attributes :data:`STEP_STRIP` / :data:`STEP_INDEX` (where the epilogue of
    the step's outputs may run).
    """
    data_reg, weight_reg = tile_a * tile_b, tile_a * tile_b + tile_a
    lanes = isa.columns
    single = all(extent == 1 for extent in reduction)
    whole = len(tile_rows) if tile_rows[-1] == tile_rows[0] else len(tile_rows) - 1
    full = whole // tile_a
    tail_rows = list(tile_rows[full * tile_a:])

    def shapes(rows):
        rows = list(rows) + [tile_rows[0]] * (tile_a - len(rows))
        acc = [(rows[i], isa.row_bytes) for i in range(tile_a) for _ in range(tile_b)]
        return acc + [(rows[i], isa.depth) for i in range(tile_a)] + [(weight_rows, isa.row_bytes)] * tile_b

    def load_weights(tiles: Tiles, column, ks) -> None:
        for j in range(tile_b):
            tiles.load(weight_reg + j, weights(column + j * lanes, *ks))

    ahead = isa.prefetch_ahead
    points = math.prod(reduction)

    def point_ahead(ks):
        # The reduction point ``ahead`` after ``ks`` (past the last, the step's first again: the next
        # step of the strip starts there).
        flat = 0
        for k, extent in zip(ks, reduction):
            flat = flat * extent + k
        flat = tir.floormod(flat + ahead, points)
        point = []
        for extent in reversed(reduction):
            point.append(tir.floormod(flat, extent))
            flat = tir.floordiv(flat, extent)
        return tuple(reversed(point))

    def reduce_loops(body, ks=()):
        if len(ks) == len(reduction):
            body(ks)
            return
        with ib.for_range(0, reduction[len(ks)], name=f"r{len(ks)}") as var:
            reduce_loops(body, ks + (var,))

    def steps(tiles: Tiles, g0, count: int, column, mark=None) -> None:
        for t in range(count * tile_b):
            tiles.zero(t)

        def products(ks):
            for i in range(count):
                tiles.load(data_reg + i, data(g0 + i, *ks))
            if not single:
                if ahead:
                    for j in range(tile_b):
                        tiles.prefetch(weight_rows, weights(column + j * lanes, *point_ahead(ks)))
                load_weights(tiles, column, ks)
            for i in range(count):
                for j in range(tile_b):
                    tiles.multiply(i * tile_b + j, data_reg + i, weight_reg + j)

        reduce_loops(products)
        with ib.new_scope():
            if mark is not None:
                ib.scope_attr(tir.StringImm(STEP_STRIP), STEP_STRIP, mark[0])
                ib.scope_attr(tir.StringImm(STEP_INDEX), STEP_INDEX, mark[1])
            for i in range(count):
                for j in range(tile_b):
                    tiles.store(i * tile_b + j, outputs(g0 + i, column + j * lanes))

    caller = SavedConfig(ib)
    for rows, count, first in ((tile_rows[:tile_a], full, None), (tail_rows, 1 if tail_rows else 0, full * tile_a)):
        if not count:
            continue
        tiles = Tiles(ib, isa, variant, shapes(rows), ask_state=False)  # the SavedConfig asked
        with ib.for_range(0, groups, name="strip") as strip:
            column = strip * tile_b * lanes
            if single:
                load_weights(tiles, column, (0,) * len(reduction))
            if first is None:
                with ib.for_range(0, full, name="step") as step:
                    steps(tiles, step * tile_a, tile_a, column, (strip, step) if mark_steps else None)
            else:
                steps(tiles, first, len(rows), column, (strip, full) if mark_steps else None)
    caller.restore()
