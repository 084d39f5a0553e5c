"""When a conv2d qualifies for the HWNC tensor-core schedules: the one rule set.

:func:`hwnc_conv2d_qualifies` is the single predicate shared by the graph
passes (``layer_table``, ``prepare_for_tensorcore(skip_layers="auto")``) and
the tensor-core schedules (strategy and legalization), so that a layer the
passes prepare is a layer the schedules take, and the other way round.

The rules, in the order they are checked
----------------------------------------
1. ``groups == 1``: grouped and depthwise convolutions have no tensor-core
   schedule.
2. The data type is one of ``int4``/``uint4``/``int8``/``uint8`` and the
   accumulator (``out_dtype``) is ``int32``.
3. After layout conversion the data layout is ``HWNC`` and the kernel layout
   ``HWOI`` (input channels innermost, the operand order of the WMMA tiles).
4. The GEMM each output pixel performs is ``M = batch``, ``N = out channels``,
   ``K = in channels``, computed in WMMA tiles of shape ``(m, n, k)``:

   * int4/uint4: ``8x8x32`` -- batch a multiple of 8, in-channels a multiple
     of 32, out-channels a multiple of 8;
   * int8/uint8: one of ``16x16x16``, ``32x8x16`` and ``8x32x16`` must divide
     (batch, out-channels, in-channels).

   Channels that are not a multiple of the tile may be zero-padded up to it
   when the extra work that padding adds, ``(N' * K') / (N * K) - 1`` with
   ``N'``/``K'`` the padded channel counts, is at most ``pad_fraction``. The
   tile with the least extra work wins (then the least batch padding).
   The batch never disqualifies a layer: padding the batch up to the tile is
   the legalization's job (a batch-1 model is padded to 8, 16 or 32 rows), so
   it is reported in :attr:`Verdict.padded` but not counted in the fraction.

A layer that fails says why in words (:attr:`Verdict.reason`), for example
``"3 input channels would be padded to 32 (+967% work > 100% allowed)"``.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

#: WMMA tile shapes ``(m, n, k)`` = (batch, out channels, in channels) per data type.
WMMA_SHAPES: Dict[str, Tuple[Tuple[int, int, int], ...]] = {
    "int4": ((8, 8, 32),),
    "uint4": ((8, 8, 32),),
    "int8": ((16, 16, 16), (32, 8, 16), (8, 32, 16)),
    "uint8": ((16, 16, 16), (32, 8, 16), (8, 32, 16)),
}

#: The accumulator type of the integer tensor-core instructions.
ACCUMULATOR_DTYPE = "int32"

#: Default tolerance for channel padding: padding may at most double the work.
DEFAULT_PAD_FRACTION = 1.0

#: Layouts the HWNC schedules consume.
DATA_LAYOUT = "HWNC"
KERNEL_LAYOUT = "HWOI"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a conv2d qualifies for the HWNC tensor-core schedules, and why not.

    Truthy exactly when it qualifies.

    Attributes
    ----------
    qualifies : bool
        The layer can run on the HWNC tensor-core schedules.
    reason : str
        Empty when it qualifies; otherwise the first rule it breaks, in words.
    wmma_shape : tuple of int or None
        The chosen tile ``(m, n, k)`` (batch, out channels, in channels).
    padded : tuple of int or None
        ``(batch, in_channels, out_channels)`` after padding to the tile.
    pad_fraction : float
        Extra work that channel padding adds (0.0 when none is needed).
    """

    qualifies: bool
    reason: str = ""
    wmma_shape: Optional[Tuple[int, int, int]] = None
    padded: Optional[Tuple[int, int, int]] = None
    pad_fraction: float = 0.0

    def __bool__(self) -> bool:
        return self.qualifies


def _round_up(value: int, tile: int) -> int:
    return -(-value // tile) * tile


def _best_tile(batch: int, in_channels: int, out_channels: int, dtype: str):
    """The tile with the least channel padding, then the least batch padding."""

    def cost(tile):
        m, n, k = tile
        extra = _round_up(out_channels, n) * _round_up(in_channels, k) / (out_channels * in_channels) - 1.0
        return (extra, _round_up(batch, m), tile)

    return min(cost(tile) for tile in WMMA_SHAPES[dtype])


def hwnc_conv2d_qualifies(
    batch: int,
    in_channels: int,
    out_channels: int,
    dtype: str,
    *,
    groups: int = 1,
    out_dtype: str = ACCUMULATOR_DTYPE,
    data_layout: str = DATA_LAYOUT,
    kernel_layout: str = KERNEL_LAYOUT,
    pad_fraction: float = DEFAULT_PAD_FRACTION,
) -> Verdict:
    """Decide whether a conv2d can run on the HWNC tensor-core schedules.

    The rules are listed in the module docstring (:mod:`tvm_tcutils.tensorcore_rules`).

    Parameters
    ----------
    batch, in_channels, out_channels : int
        The convolution's batch size and channel counts (static, positive).
    dtype : str
        Data type of the data and kernel after recasting (``int4``, ``uint4``,
        ``int8`` or ``uint8`` qualify).
    groups : int
        Convolution groups; only 1 qualifies.
    out_dtype : str
        Accumulator type; only ``int32`` qualifies.
    data_layout, kernel_layout : str
        Layouts after conversion; only ``HWNC``/``HWOI`` qualify.
    pad_fraction : float
        Largest extra work (as a fraction of the layer's work) that zero
        padding the channels up to a tile may add; the batch is always padded.

    Returns
    -------
    Verdict
        Truthy when the layer qualifies; ``reason`` says why not otherwise.

    Raises
    ------
    ValueError
        A non-positive size or a negative ``pad_fraction``.

    Examples
    --------
    >>> bool(hwnc_conv2d_qualifies(1, 64, 64, "int4"))
    True
    >>> hwnc_conv2d_qualifies(1, 3, 64, "int4").reason
    '3 input channels would be padded to 32 (+967% work > 100% allowed)'
    >>> hwnc_conv2d_qualifies(8, 64, 64, "int8").wmma_shape
    (8, 32, 16)
    """
    for name, value in (("batch", batch), ("in_channels", in_channels), ("out_channels", out_channels)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not pad_fraction >= 0:
        raise ValueError(f"pad_fraction must be >= 0, got {pad_fraction!r}")
    if groups != 1:
        return Verdict(False, f"grouped convolution (groups={groups}); tensor cores need groups=1")
    if dtype not in WMMA_SHAPES:
        return Verdict(False, f"data type {dtype} has no tensor-core schedule; needs one of {sorted(WMMA_SHAPES)}")
    if out_dtype != ACCUMULATOR_DTYPE:
        return Verdict(False, f"accumulates in {out_dtype}; tensor cores accumulate in {ACCUMULATOR_DTYPE}")
    if (data_layout, kernel_layout) != (DATA_LAYOUT, KERNEL_LAYOUT):
        return Verdict(
            False, f"layout {data_layout}/{kernel_layout}; the schedules need {DATA_LAYOUT}/{KERNEL_LAYOUT}"
        )
    extra, padded_batch, tile = _best_tile(batch, in_channels, out_channels, dtype)
    padded = (padded_batch, _round_up(in_channels, tile[2]), _round_up(out_channels, tile[1]))
    if extra > pad_fraction + 1e-12:
        what = []
        if padded[1] != in_channels:
            what.append(f"{in_channels} input channels would be padded to {padded[1]}")
        if padded[2] != out_channels:
            what.append(f"{out_channels} output channels would be padded to {padded[2]}")
        return Verdict(
            False,
            f"{' and '.join(what)} (+{extra:.0%} work > {pad_fraction:.0%} allowed)",
            tile, padded, extra,
        )
    return Verdict(True, "", tile, padded, extra)
