"""When a layer qualifies for the integer tensor-core schedules: the one rule set.

This module is the single source of the WMMA tile shapes, the padding cost and
the qualification verdict. :func:`hwnc_conv2d_qualifies` is the predicate shared
by the graph passes (``layer_table``, ``prepare_for_tensorcore(skip_layers="auto")``,
the ``count-layers``/``prepare`` commands) and the tensor-core strategy,
legalization and schedules (:mod:`tvm_tcutils.tensorcore.strategy`), so that a
layer the passes prepare is a layer the schedules take, and the other way round.

The rules, in the order they are checked
----------------------------------------
1. ``groups == 1``: grouped and depthwise convolutions have no tensor-core
   schedule.
2. Data and kernel share one of the types ``int4``/``uint4``/``int8``/``uint8``
   and the accumulator (``out_dtype``) is ``int32``.
3. The data layout is ``HWNC`` and the kernel layout ``HWOI`` (input channels
   innermost, the operand order of the WMMA tiles).
4. With a ``target``: it is CUDA with an arch that has these tensor cores
   (:data:`MIN_ARCH`), and not int4/uint4 on sm_90 or newer
   (:data:`INT4_EMULATED_FROM_ARCH`): those GPUs have no 4-bit MMA
   instruction (ptxas emulates the 4-bit tiles on 8-bit MMA), and on an
   H200 the package's int4 layers ran at about three quarters of int8's
   speed (``docs/benchmarks/tensorcore.md``), so int4 layers do not qualify
   there; int8 does.
5. The GEMM each output pixel performs is ``M = batch``, ``N = out channels``,
   ``K = in channels``, computed in WMMA tiles of shape ``(m, n, k)``:

   * int4/uint4: ``8x8x32`` -- batch a multiple of 8, in-channels a multiple
     of 32, out-channels a multiple of 8;
   * int8/uint8: one of ``16x16x16``, ``32x8x16`` and ``8x32x16`` must divide
     (batch, out-channels, in-channels).

Padding
-------
Channels that are not a multiple of the tile are zero-padded up to it when
the extra work that adds, ``(N' * K') / (N * K) - 1`` with ``N'``/``K'`` the
padded channel counts, is at most the pad fraction. The tile with the least
extra work wins (then the least batch padding, then the order of
:data:`WMMA_SHAPES`). The batch never disqualifies a layer: the legalization
always pads it up to the tile (a batch-1 model runs as 8, 16 or 32 rows), so it
is reported in :attr:`Verdict.padded` but not counted in the fraction -- the
batch is the deployment's choice, the channels are the model's.

The pad fraction is one setting for the whole package: :func:`max_pad_fraction`
(default :data:`DEFAULT_PAD_FRACTION`), changed for a scope with
:func:`pad_limit` or for the process with :func:`set_max_pad_fraction`. Both the
passes (when given no explicit ``pad_fraction``) and the legalization read it,
so ``with pad_limit(f): prepare_for_tensorcore(...); relay.build(...)`` skips
exactly the layers the build leaves off tensor cores.

A layer that fails says why in words (:attr:`Verdict.reason`), for example
``"3 input channels would be padded to 32 (+967% work > 100% allowed)"``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

from .._tvm import tvm


class WmmaShape(NamedTuple):
    """One ``m x n x k`` WMMA tile shape (equal to the tuple ``(m, n, k)``).

    ``m`` tiles the rows of A (the batch), ``n`` the columns of B (the output
    channels) and ``k`` the reduction (the input channels).

    Examples
    --------
    >>> WmmaShape(16, 16, 16).name
    '16x16x16'
    """

    m: int
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


#: WMMA tile shapes CUDA offers per operand type (first entry: the preferred one).
WMMA_SHAPES: Dict[str, Tuple[WmmaShape, ...]] = {
    "int4": (WmmaShape(8, 8, 32),),
    "uint4": (WmmaShape(8, 8, 32),),
    "int8": (WmmaShape(16, 16, 16), WmmaShape(32, 8, 16), WmmaShape(8, 32, 16)),
    "uint8": (WmmaShape(16, 16, 16), WmmaShape(32, 8, 16), WmmaShape(8, 32, 16)),
}

#: Minimum compute capability (``sm_XY`` as the integer ``XY``) per operand type:
#: integer WMMA appeared with sm_72 (8-bit) and sm_75 (4-bit, experimental sub-byte).
MIN_ARCH: Dict[str, int] = {"int4": 75, "uint4": 75, "int8": 72, "uint8": 72}

#: From this compute capability on CUDA has no 4-bit integer MMA instruction. ptxas compiles the
#: int4/uint4 WMMA tiles (``mma.sync`` m8n8k32 ``.s4``) to 8-bit ones after unpacking the nibbles --
#: CUDA 13 gives ``IMMA.8816.S8.S8`` for sm_90 and ``IMMA.16816.S8.S8`` for sm_100/sm_120 where
#: sm_75-sm_89 have ``IMMA.8832.S4.S4`` (python_tests/tensorcore/test_sass.py checks the SASS).
#: int4's tensor-core throughput over int8 is gone: on an H200 (sm_90) the package's int4 layers of ResNet-50
#: ran at x0.56-x0.94 of their int8 speed (docs/benchmarks/tensorcore.md), so from this arch on int4/uint4
#: layers do not qualify.
INT4_EMULATED_FROM_ARCH = 90

#: Operand types without a tensor-core instruction of their own from :data:`INT4_EMULATED_FROM_ARCH` on.
EMULATED_DTYPES = ("int4", "uint4")

#: The accumulator type of the integer tensor-core instructions.
ACCUMULATOR_DTYPE = "int32"

#: Default tolerance for channel padding: padding may at most double the work.
DEFAULT_PAD_FRACTION = 1.0

#: Layouts the HWNC schedules consume.
DATA_LAYOUT = "HWNC"
KERNEL_LAYOUT = "HWOI"

#: The arch TVM writes into a CUDA target given without ``-arch`` when it finds no GPU.
TVM_DEFAULT_ARCH = 50

#: Appended to reasons when the arch may be TVM's default rather than the user's choice.
ARCH_HINT = (
    " (sm_50 is what TVM assumes when the target has no -arch and no GPU is found: "
    "add the architecture, for example 'cuda -arch=sm_80')"
)

_ARCH = re.compile(r"^sm_(\d+)[a-z]?$")
_PAD_FRACTION = [DEFAULT_PAD_FRACTION]


class MissingArchError(ValueError):
    """A CUDA target without ``-arch`` on a machine without a GPU to ask."""


# --------------------------------------------------------------------------
# The pad-fraction setting.
# --------------------------------------------------------------------------
def max_pad_fraction() -> float:
    """Current limit on the extra work channel padding may add (1.0 = may double it).

    Examples
    --------
    >>> max_pad_fraction() >= 0
    True
    """
    return _PAD_FRACTION[-1]


def _check_fraction(fraction: float, name: str = "max_pad_fraction") -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not fraction >= 0:
        raise ValueError(f"{name} must be a number >= 0 (0.25 = 25% extra work), got {fraction!r}")
    return float(fraction)


def set_max_pad_fraction(fraction: float) -> None:
    """Set the padding limit for the rest of the process (outside any :func:`pad_limit` scope).

    Examples
    --------
    >>> set_max_pad_fraction(0.25); max_pad_fraction()
    0.25
    >>> set_max_pad_fraction(DEFAULT_PAD_FRACTION); max_pad_fraction()
    1.0
    """
    _PAD_FRACTION[0] = _check_fraction(fraction)


@contextlib.contextmanager
def pad_limit(fraction: float) -> Iterator[None]:
    """Scope in which channel padding may add up to ``fraction`` extra work.

    ``0`` never pads channels (layers that do not fit are skipped by the
    passes and go to the non-tensor-core path in the build); ``float('inf')``
    always pads. TVM's ``PassContext`` config keys cannot be registered from
    Python, hence a module setting.

    Examples
    --------
    >>> with pad_limit(0.5):
    ...     max_pad_fraction()
    0.5
    """
    _PAD_FRACTION.append(_check_fraction(fraction))
    try:
        yield
    finally:
        _PAD_FRACTION.pop()


# --------------------------------------------------------------------------
# Target.
# --------------------------------------------------------------------------
def target_arch(target: tvm.target.Target) -> int:
    """Compute capability of a CUDA ``target`` as an integer (``sm_80`` -> 80).

    The target's ``-arch`` wins; without it the local GPU is asked. With
    neither, tensor-core support cannot be decided.

    Raises
    ------
    MissingArchError
        When the target has no ``-arch`` and no CUDA device is present.
    ValueError
        For an ``-arch`` that is not of the form ``sm_XY``.

    Examples
    --------
    >>> target_arch(tvm.target.Target("cuda -arch=sm_80"))
    80
    """
    arch = target.attrs.get("arch", None) if target.attrs else None
    if arch:
        found = _ARCH.match(str(arch))
        if not found:
            raise ValueError(f"target -arch={arch!r} is not of the form sm_XY (for example sm_80)")
        return int(found.group(1))
    try:
        device = tvm.cuda(0)
        if device.exist:
            return int(str(device.compute_version).replace(".", ""))
    except (tvm.TVMError, ValueError):  # no CUDA runtime in this TVM build: same as no device
        pass
    raise MissingArchError(
        f"target {str(target)!r} has no -arch and there is no GPU to ask, so TVM cannot tell whether "
        f"it has tensor cores: add the architecture to the target, for example 'cuda -arch=sm_80' "
        f"(int8 tensor cores need sm_72 or newer, int4 sm_75 or newer)"
    )


def unsupported_reason(dtype: str, target: Optional[tvm.target.Target]) -> str:
    """Why ``dtype`` may not use ``target``'s tensor cores although the arch has some, or ``""``.

    int4/uint4 on sm_90 and newer (:data:`INT4_EMULATED_FROM_ARCH`): there is no
    4-bit MMA instruction (ptxas runs the 4-bit tiles on 8-bit MMA), and int4
    layers were slower than int8 ones on an H200. Only CUDA targets are
    judged (``""`` for others and for ``None``).

    Raises
    ------
    MissingArchError
        An int4/uint4 ``dtype`` with a CUDA ``target`` without ``-arch`` on a machine without a GPU.

    Examples
    --------
    >>> print(unsupported_reason("uint4", tvm.target.Target("cuda -arch=sm_90")))  # doctest: +ELLIPSIS
    uint4 on sm_90 and newer (target has sm_90): no 4-bit MMA instruction (emulated on 8-bit MMA: ...); use int8
    >>> unsupported_reason("int4", tvm.target.Target("cuda -arch=sm_80")), unsupported_reason("int8", None)
    ('', '')
    """
    if target is None or target.kind.name != "cuda" or dtype not in EMULATED_DTYPES:
        return ""
    arch = target_arch(target)
    if arch < INT4_EMULATED_FROM_ARCH:
        return ""
    return (
        f"{dtype} on sm_{INT4_EMULATED_FROM_ARCH} and newer (target has sm_{arch}): no 4-bit MMA instruction "
        "(emulated on 8-bit MMA: int4 layers ran slower than int8 on an H200, docs/benchmarks/tensorcore.md); "
        "use int8"
    )


def _target_reason(dtype: str, target) -> str:
    if target.kind.name != "cuda":
        return f"target {target} is not cuda"
    arch = target_arch(target)
    if arch < MIN_ARCH[dtype]:
        hint = ARCH_HINT if arch == TVM_DEFAULT_ARCH else ""
        return f"{dtype} tensor cores need sm_{MIN_ARCH[dtype]} or newer, target has sm_{arch}{hint}"
    return unsupported_reason(dtype, target)


# --------------------------------------------------------------------------
# Tiles and padding.
# --------------------------------------------------------------------------
def _round_up(value: int, tile: int) -> int:
    return -(-value // tile) * tile


def fitting_shapes(dtype: str, batch: int, in_channels: int, out_channels: int) -> Tuple[WmmaShape, ...]:
    """WMMA shapes of ``dtype`` that tile ``batch x out_channels x in_channels`` exactly (no padding).

    Examples
    --------
    >>> [s.name for s in fitting_shapes("int8", 8, 64, 64)]
    ['8x32x16']
    """
    return tuple(
        s for s in WMMA_SHAPES.get(dtype, ())
        if batch % s.m == 0 and out_channels % s.n == 0 and in_channels % s.k == 0
    )


def _padding_plan(dtype: str, batch: int, in_channels: int, out_channels: int):
    """(channel extra work, padded (batch, in, out), tile) of the cheapest tile of ``dtype``."""

    def plan(order_and_tile):
        order, tile = order_and_tile
        padded = (_round_up(batch, tile.m), _round_up(in_channels, tile.k), _round_up(out_channels, tile.n))
        extra = padded[2] * padded[1] / (out_channels * in_channels) - 1.0
        return (extra, padded[0], order), padded, tile

    key, padded, tile = min((plan(item) for item in enumerate(WMMA_SHAPES[dtype])), key=lambda p: p[0])
    return key[0], padded, tile


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a layer qualifies for the tensor-core schedules, and why not.

    Truthy exactly when it qualifies.

    Attributes
    ----------
    qualifies : bool
        The layer can run on the tensor-core schedules (after padding to ``padded``).
    reason : str
        Empty when it qualifies; otherwise the first rule it breaks, in words.
    wmma_shape : WmmaShape or None
        The chosen tile ``(m, n, k)`` (batch, out channels, in channels).
    padded : tuple of int or None
        ``(batch, in_channels, out_channels)`` after padding to the tile.
    pad_fraction : float
        Extra work that channel padding adds (0.0 when none is needed).
    """

    qualifies: bool
    reason: str = ""
    wmma_shape: Optional[WmmaShape] = None
    padded: Optional[Tuple[int, int, int]] = None
    pad_fraction: float = 0.0

    def __bool__(self) -> bool:
        return self.qualifies


def hwnc_conv2d_qualifies(
    batch: int,
    in_channels: int,
    out_channels: int,
    dtype: str,
    *,
    kernel_dtype: Optional[str] = None,
    groups: int = 1,
    out_dtype: str = ACCUMULATOR_DTYPE,
    data_layout: str = DATA_LAYOUT,
    kernel_layout: str = KERNEL_LAYOUT,
    pad_fraction: Optional[float] = None,
    target: Optional[tvm.target.Target] = None,
) -> Verdict:
    """Decide whether a conv2d can run on the HWNC tensor-core schedules.

    The rules are listed in the module docstring (:mod:`tvm_tcutils.tensorcore.rules`).
    A dense layer is the same GEMM (batch x out x in); it qualifies without
    padding exactly when the verdict's ``padded`` equals its sizes.

    Parameters
    ----------
    batch, in_channels, out_channels : int
        The convolution's batch size and channel counts (static, positive).
    dtype : str
        Data type of the data after recasting (``int4``, ``uint4``, ``int8``
        or ``uint8`` qualify).
    kernel_dtype : str, optional
        Data type of the kernel; must equal ``dtype`` (default: ``dtype``).
    groups : int
        Convolution groups; only 1 qualifies.
    out_dtype : str
        Accumulator type; only ``int32`` qualifies.
    data_layout, kernel_layout : str
        Layouts after conversion; only ``HWNC``/``HWOI`` qualify.
    pad_fraction : float, optional
        Largest extra work (as a fraction of the layer's work) that zero
        padding the channels up to a tile may add; the batch is always padded.
        Default: the current setting, :func:`max_pad_fraction`.
    target : tvm.target.Target, optional
        When given, the layer also needs a CUDA target whose arch has tensor
        cores for ``dtype``, and int4/uint4 do not qualify on sm_90 or newer
        (:func:`unsupported_reason`); without a target only the layer itself is
        judged.

    Returns
    -------
    Verdict
        Truthy when the layer qualifies; ``reason`` says why not otherwise.

    Raises
    ------
    ValueError
        A non-positive size or a negative ``pad_fraction``.
    MissingArchError
        A CUDA ``target`` without ``-arch`` on a machine without a GPU.

    Examples
    --------
    >>> bool(hwnc_conv2d_qualifies(1, 64, 64, "int4"))
    True
    >>> hwnc_conv2d_qualifies(1, 3, 64, "int4").reason
    '3 input channels would be padded to 32 (+967% work > 100% allowed)'
    >>> hwnc_conv2d_qualifies(8, 64, 64, "int8").wmma_shape
    WmmaShape(m=8, n=32, k=16)
    >>> hwnc_conv2d_qualifies(8, 64, 64, "int4", target=tvm.target.Target("cuda -arch=sm_72")).reason
    'int4 tensor cores need sm_75 or newer, target has sm_72'
    >>> hopper = hwnc_conv2d_qualifies(8, 64, 64, "int4", target=tvm.target.Target("cuda -arch=sm_90"))
    >>> bool(hopper), hopper.reason.split(":")[0]
    (False, 'int4 on sm_90 and newer (target has sm_90)')
    """
    for name, value in (("batch", batch), ("in_channels", in_channels), ("out_channels", out_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    limit = max_pad_fraction() if pad_fraction is None else _check_fraction(pad_fraction, "pad_fraction")
    kernel_dtype = dtype if kernel_dtype is None else kernel_dtype
    if groups != 1:
        return Verdict(False, f"grouped convolution (groups={groups}); tensor cores need groups=1")
    if dtype not in WMMA_SHAPES:
        return Verdict(False, f"data type {dtype} has no integer tensor-core type (valid: {sorted(WMMA_SHAPES)})")
    if kernel_dtype != dtype:
        return Verdict(False, f"data {dtype} and kernel {kernel_dtype} differ")
    if out_dtype != ACCUMULATOR_DTYPE:
        return Verdict(False, f"accumulates in {out_dtype}; tensor cores accumulate in {ACCUMULATOR_DTYPE}")
    if (data_layout, kernel_layout) != (DATA_LAYOUT, KERNEL_LAYOUT):
        return Verdict(
            False, f"layout {data_layout}/{kernel_layout}; the schedules need {DATA_LAYOUT}/{KERNEL_LAYOUT}"
        )
    reason = _target_reason(dtype, target) if target is not None else ""
    if reason:
        return Verdict(False, reason)
    extra, padded, tile = _padding_plan(dtype, batch, in_channels, out_channels)
    if extra > limit + 1e-12:
        what = []
        if padded[1] != in_channels:
            what.append(f"{in_channels} input channels would be padded to {padded[1]}")
        if padded[2] != out_channels:
            what.append(f"{out_channels} output channels would be padded to {padded[2]}")
        return Verdict(False, f"{' and '.join(what)} (+{extra:.0%} work > {limit:.0%} allowed)", tile, padded, extra)
    return Verdict(True, "", tile, padded, extra)
