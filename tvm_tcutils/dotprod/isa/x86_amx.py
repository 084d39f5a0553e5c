"""x86 AMX-INT8: a tile engine multiplying 16 x 64-byte tiles (``tdpbusd`` and its sign pairs).

One ``tdp*`` instruction takes an ``A`` tile of ``rows`` x ``row_bytes`` 8-bit values (16 rows of 64 bytes:
16 data rows by 64 reduction values), a ``B`` tile of ``row_bytes / 4`` rows of 4-value groups (the VNNI-4
layout: 16 rows of 16 columns x 4 reduction values, the layout the dot-product kernels already pack weights
in) and accumulates the 16 x 16 int32 products into a ``C`` tile: 2048 int8 multiply-adds, against 256 for
one AVX-512 ``vpdpbusd``. A core has :attr:`TileISA.tiles` tile registers, configured by a 64-byte block
(``ldtilecfg``) that is per thread; the process must first ask the kernel for the tile state
(:mod:`tvm_tcutils.dotprod.amx`). Unlike VNNI, every sign pair is native.

A kernel family of its own beside the 4-way dot-product rows (:data:`~tvm_tcutils.dotprod.isa.ISAS`): the
vector row (:attr:`TileISA.vector`) stays the target's ISA for everything the tiles do not pay for.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Tuple

from .. import amx as _machine  # palette 1's geometry (the machine's side imports no ISA)
from .base import DotVariant, target_has
from .x86_vnni import X86_VNNI

#: LLVM intrinsics of the tile operations (tile registers as immediate operands).
LOAD, STORE, ZERO, CONFIG = "llvm.x86.tileloadd64", "llvm.x86.tilestored64", "llvm.x86.tilezero", "llvm.x86.ldtilecfg"
#: Stores the thread's current tile configuration (64 zero bytes where none is loaded).
SAVE_CONFIG = "llvm.x86.sttilecfg"


@dataclasses.dataclass(frozen=True)
class TileISA:
    """An int8 tile-multiply engine.

    Parameters
    ----------
    name : str
        Short name (``"x86_amx"``).
    variants : tuple of DotVariant
        ``(data, kernel)`` dtype pairs and the LLVM intrinsic of each.
    supports : callable
        ``supports(target) -> bool``: the target has the tile instructions and, on a machine that
        has them too, the process may use them (:func:`tvm_tcutils.dotprod.amx.usable`).
    rows, row_bytes : int
        Rows of a tile and bytes of a row (palette 1: 16 x 64).
    tiles : int
        Tile registers.
    reduce : int
        Products per int32 of a ``B`` tile row (VNNI-4).
    palette : int
        The palette the kernels configure.
    vector : DotProductISA
        The 4-way dot-product row of targets with this engine: the exact fallback.
    prefetch_ahead : int
        Reduction points ahead whose weight tiles a step asks the L1 cache for (0: none). Tile registers
        are not renamed, so a weight tile's load waits for the products still reading its register and
        only the hardware prefetcher fetches ahead; it follows a weight's 4 KB blocks poorly (each
        point reads part of one block). One point ahead measured best on an Emerald Rapids core
        (ResNet-50 QDQ x1.04, BERT-base QDQ x1.08 end to end; two points ahead or into L2 less or
        slower).
    """

    name: str
    variants: Tuple[DotVariant, ...]
    supports: Callable[[object], bool]
    rows: int = 16
    row_bytes: int = 64
    tiles: int = 8
    reduce: int = 4
    palette: int = 1
    vector: object = X86_VNNI
    prefetch_ahead: int = 1

    @property
    def columns(self) -> int:
        """int32 columns of a ``C`` tile (``row_bytes / 4``)."""
        return self.row_bytes // 4

    @property
    def depth(self) -> int:
        """Reduction values one tile product consumes (``row_bytes``)."""
        return self.row_bytes

    def variant(self, data_dtype: str, kernel_dtype: str) -> Optional[DotVariant]:
        """The native variant of a dtype pair, or None.

        Examples
        --------
        >>> X86_AMX.variant("uint8", "uint8").intrinsic
        'llvm.x86.tdpbuud'
        >>> X86_AMX.variant("int16", "int8") is None
        True
        """
        for var in self.variants:
            if (var.data_dtype, var.kernel_dtype) == (str(data_dtype), str(kernel_dtype)):
                return var
        return None

    def block(self) -> Tuple[int, int]:
        """Untuned ``(A tiles, B tiles)`` of one step: the most products per tile loaded while every
        ``C`` tile, ``A`` tile and ``B`` tile has a register (``a * b + a + b <= tiles``).

        Examples
        --------
        >>> X86_AMX.block()
        (2, 2)
        """
        shapes = [(a, b) for a in range(1, self.tiles) for b in range(1, self.tiles) if a * b + a + b <= self.tiles]
        # Ties (3 x 1 vs 1 x 3) prefer more B tiles: wider steps share each data tile among more columns.
        return max(shapes, key=lambda ab: (ab[0] * ab[1] / (ab[0] + ab[1]), ab[1]))

    def fits(self, a_tiles: int, b_tiles: int) -> bool:
        """Whether a step of ``a_tiles`` x ``b_tiles`` has a register for every tile.

        Examples
        --------
        >>> X86_AMX.fits(2, 2), X86_AMX.fits(2, 3)
        (True, False)
        """
        return a_tiles >= 1 and b_tiles >= 1 and a_tiles * b_tiles + a_tiles + b_tiles <= self.tiles


def _supports(target) -> bool:
    if not target_has(target, "amx-tile", "amx-int8"):
        return False
    # The machine's side: a host with the engine must also grant the tile state.
    return _machine.allowed_for(target)


X86_AMX = TileISA(
    name="x86_amx",
    variants=(
        DotVariant("uint8", "int8", "llvm.x86.tdpbusd"),
        DotVariant("int8", "int8", "llvm.x86.tdpbssd"),
        DotVariant("uint8", "uint8", "llvm.x86.tdpbuud"),
        DotVariant("int8", "uint8", "llvm.x86.tdpbsud"),
    ),
    supports=_supports,
    rows=_machine.ROWS, row_bytes=_machine.ROW_BYTES, tiles=_machine.TILES, palette=_machine.PALETTE,
)
