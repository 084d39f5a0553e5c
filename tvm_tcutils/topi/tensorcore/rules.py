"""When a layer qualifies for integer tensor cores (one predicate) and which arch a target has.

Until the package-wide rules (``tvm_tcutils.tensorcore_rules``) land, this is
the single predicate the tensor-core computes, strategy rows and legalization
share.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Tuple

from ..._tvm import tvm
from .wmma import ACCUMULATOR_DTYPE, MIN_ARCH, WMMA_SHAPES, WmmaShape

_ARCH = re.compile(r"^sm_(\d+)[a-z]?$")


#: The arch TVM writes into a CUDA target given without ``-arch`` when it finds no GPU.
TVM_DEFAULT_ARCH = 50

#: Appended to reasons when the arch may be TVM's default rather than the user's choice.
ARCH_HINT = (
    " (sm_50 is what TVM assumes when the target has no -arch and no GPU is found: "
    "add the architecture, for example 'cuda -arch=sm_80')"
)


class MissingArchError(ValueError):
    """A CUDA target without ``-arch`` on a machine without a GPU to ask."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Answer of :func:`qualifies`: ``shape`` is the WMMA shape to use, ``reason`` why not."""

    shape: Optional[WmmaShape]
    reason: str = ""

    def __bool__(self) -> bool:
        return self.shape is not None


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
    except Exception:  # no CUDA runtime in this TVM build: same as no device
        pass
    raise MissingArchError(
        f"target {str(target)!r} has no -arch and there is no GPU to ask, so TVM cannot tell whether "
        f"it has tensor cores: add the architecture to the target, for example 'cuda -arch=sm_80' "
        f"(int8 tensor cores need sm_72 or newer, int4 sm_75 or newer)"
    )


def fitting_shapes(dtype: str, batch: int, in_channels: int, out_channels: int) -> Tuple[WmmaShape, ...]:
    """WMMA shapes of ``dtype`` that tile ``batch x out_channels x in_channels`` exactly.

    Examples
    --------
    >>> [s.name for s in fitting_shapes("int8", 8, 64, 64)]
    ['8x32x16']
    """
    return tuple(
        s for s in WMMA_SHAPES.get(dtype, ())
        if batch % s.m == 0 and out_channels % s.n == 0 and in_channels % s.k == 0
    )


def qualifies(
    data_dtype: str,
    kernel_dtype: str,
    out_dtype: str,
    batch: int,
    in_channels: int,
    out_channels: int,
    target: Optional[tvm.target.Target],
    groups: int = 1,
) -> Verdict:
    """Whether a GEMM-like layer (conv2d HWNC or dense) runs on integer tensor cores.

    The layer qualifies when both operands share one int4/uint4/int8/uint8
    type, the output is int32, the convolution is not grouped, the target is
    CUDA with a new enough arch, and some WMMA shape tiles
    ``batch x out_channels x in_channels`` exactly.

    Returns
    -------
    Verdict
        Truthy with the preferred fitting shape, or falsy with the reason.

    Raises
    ------
    MissingArchError
        When the arch of a CUDA target cannot be determined (see :func:`target_arch`).

    Examples
    --------
    >>> cuda = tvm.target.Target("cuda -arch=sm_80")
    >>> qualifies("int4", "int4", "int32", 8, 64, 64, cuda).shape.name
    '8x8x32'
    >>> qualifies("int4", "int4", "int32", 8, 3, 64, cuda).reason
    'int4 needs batch % 8, in_channels % 32, out_channels % 8 (got batch=8, in=3, out=64)'
    """
    if data_dtype != kernel_dtype:
        return Verdict(None, f"data {data_dtype} and kernel {kernel_dtype} differ")
    if data_dtype not in WMMA_SHAPES:
        return Verdict(None, f"{data_dtype} has no integer tensor-core type (valid: {sorted(WMMA_SHAPES)})")
    if out_dtype != ACCUMULATOR_DTYPE:
        return Verdict(None, f"out_dtype {out_dtype} is not {ACCUMULATOR_DTYPE}")
    if groups != 1:
        return Verdict(None, f"grouped convolution (groups={groups})")
    if target is None or target.kind.name != "cuda":
        return Verdict(None, f"target {target} is not cuda")
    arch = target_arch(target)
    if arch < MIN_ARCH[data_dtype]:
        hint = ARCH_HINT if arch == TVM_DEFAULT_ARCH else ""
        return Verdict(
            None, f"{data_dtype} tensor cores need sm_{MIN_ARCH[data_dtype]} or newer, target has sm_{arch}{hint}"
        )
    shapes = fitting_shapes(data_dtype, batch, in_channels, out_channels)
    if not shapes:
        need = " or ".join(
            f"batch % {s.m}, in_channels % {s.k}, out_channels % {s.n}" for s in WMMA_SHAPES[data_dtype]
        )
        return Verdict(
            None, f"{data_dtype} needs {need} (got batch={batch}, in={in_channels}, out={out_channels})"
        )
    return Verdict(shapes[0])
