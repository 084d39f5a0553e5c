"""The toolchains Collage knows and :func:`resolve`, which turns names into them.

Known toolchains: ``tvm`` (TVM itself), ``tvm-fastmath`` (TVM with its
``FastMath`` rewrite; one TVM toolchain per search), ``ort`` (ONNX Runtime, compiler
``tcutils_ort``, graph style), ``openvino`` and ``openvino-bf16`` (OpenVINO's CPU
runtime in f32 / bf16, compilers ``tcutils_openvino[_bf16]``, graph style), ``blas`` (an optimized BLAS, compiler
``tcutils_blas``, library style), and every BYOC integration that registered
a pattern table in ``relay.op.contrib`` (dnnl, cutlass, tensorrt, ...), under
its own name. BYOC toolchains are searchable wherever their pattern table is
registered; building their partitions needs their codegen
(``relay.ext.<compiler>``), which a CPU-only TVM may lack.
"""
from __future__ import annotations

import logging
import warnings
from typing import Dict, List, Optional, Sequence, Union

from ..._tvm import tvm  # noqa: F401
from tvm.relay.op.contrib import register as _contrib

from ..candidates import lowering_toolchain
from .base import Toolchain
from .openvino import TOOLCHAIN_BF16 as _OPENVINO_BF16, TOOLCHAIN_F32 as _OPENVINO
from .tvm import TVM, TVM_FASTMATH

logger = logging.getLogger("tvm_tcutils.collage")

#: Toolchains of this package (their pattern tables and codegens are registered
#: by the package's toolchain modules).
PACKAGE_TOOLCHAINS: Dict[str, Toolchain] = {
    "tvm": TVM,
    "tvm-fastmath": TVM_FASTMATH,
    "ort": Toolchain(
        "ort", "tcutils_ort", pattern_table="tcutils_ort", combine=True, max_depth=4,
        requires=("onnxruntime", "onnx"), description="ONNX Runtime (CPU provider), graph style",
        runs_onnx_file=True,
    ),
    "openvino": _OPENVINO,
    "openvino-bf16": _OPENVINO_BF16,
    "blas": Toolchain(
        "blas", "tcutils_blas", pattern_table="tcutils_blas", max_depth=2,
        description="dense / batch_matmul / matmul through an optimized BLAS, library style",
    ),
}

#: BYOC integrations that compile whole sub-graphs (the others are library style).
GRAPH_STYLE = frozenset({"tensorrt", "clml", "arm_compute_lib", "mrvl"})

#: The toolchains used when none are named.
DEFAULT = ("tvm", "ort", "blas")


def known() -> Dict[str, Toolchain]:
    """Every toolchain known now: the package's and one per registered BYOC pattern table.

    Examples
    --------
    >>> sorted(known())[:3]  # doctest: +SKIP
    ['arm_compute_lib', 'blas', 'bnns']
    """
    table = dict(PACKAGE_TOOLCHAINS)
    compilers = {tc.compiler for tc in table.values()}
    for name in sorted(_contrib._PATTERN_TABLES):
        if name in compilers or name in table:
            continue
        table[name] = Toolchain(
            name, name, pattern_table=name, op_predicates=name, combine=name in GRAPH_STYLE,
            max_depth=6 if name in GRAPH_STYLE else 3,
            description=f"BYOC {name} (pattern table in relay.op.contrib)",
        )
    return table


def available() -> List[str]:
    """Names of the known toolchains usable here.

    Examples
    --------
    >>> "tvm" in available()
    True
    """
    return [name for name, tc in known().items() if tc.availability()[0]]


def with_max_depth(toolchains: Sequence[Toolchain], spec: str) -> List[Toolchain]:
    """``toolchains`` with maximum depths changed by a ``"name=N,name=N"`` spec.

    Examples
    --------
    >>> [tc.max_depth for tc in with_max_depth(resolve("tvm"), "tvm=2")]
    [2]
    """
    import dataclasses

    depths: Dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition("=")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"max depth: expected NAME=N with N >= 1, got {item!r}")
        depths[name.strip()] = int(value)
    unknown = sorted(set(depths) - {tc.name for tc in toolchains})
    if unknown:
        raise ValueError(f"max depth: {unknown} are not among the toolchains {[tc.name for tc in toolchains]}")
    return [dataclasses.replace(tc, max_depth=depths.get(tc.name, tc.max_depth)) for tc in toolchains]


def tvm_toolchain(toolchains: Union[Sequence[Toolchain], Dict[str, Toolchain]]) -> Toolchain:
    """The TVM toolchain among ``toolchains`` (what lowers ``main``); plain :data:`TVM` if none.

    Examples
    --------
    >>> tvm_toolchain(resolve("tvm-fastmath,ort")).name
    'tvm-fastmath'
    >>> tvm_toolchain(resolve("tvm-fastmath,tvm")).name  # fast math a choice per partition
    'tvm'
    """
    values = list(toolchains.values() if isinstance(toolchains, dict) else toolchains)
    return lowering_toolchain(values) or TVM


def resolve(names: Union[None, str, Sequence[Union[str, Toolchain]]] = None) -> List[Toolchain]:
    """Toolchains for a search, TVM first.

    Parameters
    ----------
    names : None, str or sequence of str / Toolchain
        ``None`` means :data:`DEFAULT`, where a toolchain not installed here is
        left out with a warning. Named toolchains (a comma-separated string or
        a list) must exist and be available, else ``ValueError`` lists what is
        available. ``tvm`` is always included: it is the fallback that can run
        every operator. One TVM toolchain lowers ``main`` (``tvm``, or
        ``tvm-fastmath`` named alone); ``tvm,tvm-fastmath`` makes fast math a
        choice per partition.

    Examples
    --------
    >>> [tc.name for tc in resolve("tvm")]
    ['tvm']
    >>> resolve("nosuch")
    Traceback (most recent call last):
    ...
    ValueError: toolchains: unknown toolchain 'nosuch'; available: ...
    """
    table = known()
    explicit = names is not None
    if names is None:
        names = DEFAULT
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not isinstance(names, (list, tuple)):
        raise TypeError(f"toolchains must be a comma-separated string or a list, got {type(names).__name__}")
    chosen: List[Toolchain] = []
    for item in names:
        if isinstance(item, Toolchain):
            tc: Optional[Toolchain] = item
        elif isinstance(item, str):
            tc = table.get(item)
            if tc is None:
                raise ValueError(
                    f"toolchains: unknown toolchain {item!r}; available: {', '.join(available())}"
                )
        else:
            raise TypeError(f"toolchains: expected a name or a Toolchain, got {type(item).__name__}")
        ok, reason = tc.availability()
        if not ok:
            if explicit:
                raise ValueError(
                    f"toolchains: {tc.name!r} is not available here ({reason}); "
                    f"available: {', '.join(available())}"
                )
            warnings.warn(f"Collage: toolchain {tc.name!r} left out: {reason}", stacklevel=2)
            logger.warning("toolchain %s left out: %s", tc.name, reason)
            continue
        if all(tc.name != c.name for c in chosen):
            chosen.append(tc)
    tvms = [tc for tc in chosen if tc.is_tvm]
    lowering = [tc.name for tc in tvms if not tc.lossy] or [tc.name for tc in tvms][:1]
    if len(lowering) > 1 or any(tc.lossy and not tc.fast_math for tc in tvms):
        raise ValueError(f"toolchains: at most one TVM toolchain lowers main, got {[tc.name for tc in tvms]}; "
                         "a second one must be a fast-math mode of it (tvm,tvm-fastmath)")
    if not tvms:
        chosen.insert(0, TVM)
    # TVM first, the one that lowers main (the exact one) ahead of its fast-math mode.
    chosen.sort(key=lambda tc: (not tc.is_tvm, tc.lossy))
    return chosen


__all__ = ["Toolchain", "TVM", "TVM_FASTMATH", "tvm_toolchain", "known", "available", "resolve", "with_max_depth",
           "PACKAGE_TOOLCHAINS", "DEFAULT"]
