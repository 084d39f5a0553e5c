"""Pieces shared by the dot-product conv2d and dense schedules."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..._tvm import tvm
from tvm import te

from ..isa import DotProductISA, for_target, range_isa


def current_isa(data_dtype: str, kernel_dtype: str, reduce_range: bool = False) -> DotProductISA:
    """The dot-product ISA of the current target that computes ``data x kernel`` natively.

    ``reduce_range``: the kernel carries the mark of a checked reduce-range kernel (see
    :mod:`..isa.x86_avx2_u8s7`), so the target's range ISA (:func:`~..isa.range_isa`) is meant.

    Raises
    ------
    ValueError
        When there is no current target, it has no dot-product ISA, or the
        ISA has no such dtype pair.

    Examples
    --------
    >>> import tvm
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     current_isa("uint8", "int8").name
    'x86_vnni'
    >>> with tvm.target.Target("llvm -mcpu=core-avx2"):
    ...     current_isa("uint8", "int8", reduce_range=True).name
    'x86_avx2_u8s7'
    """
    target = tvm.target.Target.current(allow_none=True)
    isa = range_isa(target) if reduce_range else for_target(target)
    if isa is None:
        need = "AVX2 without VNNI" if reduce_range else "VNNI, AVX2 or HVX"
        raise ValueError(f"target {target} has no {'reduce-range ' * reduce_range}4-way dot-product "
                         f"instruction (need {need})")
    if isa.variant(data_dtype, kernel_dtype) is None:
        native = [(v.data_dtype, v.kernel_dtype) for v in isa.variants]
        raise ValueError(
            f"{isa.name} cannot multiply {data_dtype} data by {kernel_dtype} kernels; native pairs: {native}"
        )
    return isa


def divisors_up_to(n: int, limit: int) -> List[int]:
    """Divisors of ``n`` not above ``limit``, ascending.

    Examples
    --------
    >>> divisors_up_to(28, 8)
    [1, 2, 4, 7]
    """
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def find_op(outs, tag: str) -> Optional[te.Tensor]:
    """The output tensor of the first op tagged ``tag`` reachable from ``outs`` (iterative)."""
    stack, seen = [t.op for t in outs], set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.tag == tag:
            return op.output(0)
        stack.extend(t.op for t in op.input_tensors)
    return None


def pair(value) -> Tuple[int, int]:
    """A conv's stride or dilation as ``(height, width)``: an int, or one or two values.

    Examples
    --------
    >>> pair(2), pair([1]), pair((1, 3))
    ((2, 2), (1, 1), (1, 3))
    """
    if isinstance(value, int):
        return (value, value)
    value = tuple(int(v) for v in value)
    return value if len(value) == 2 else (value[0], value[0])


def measuring_packed_alone() -> bool:
    """Whether a template that packs its plain operands should take them packed instead: an AutoTVM tuner
    is measuring it. A network runs the packed op alone (alter-layout packs constant weights at compile
    time and the data's layout once for the network), so that is the kernel to tune -- as TVM's own x86
    ``conv2d_NCHWc`` template measures. With its packing stages a measurement of ResNet-18's 7x7-stage
    3x3 conv took 880-1,000 us where the network's kernel takes about 515 with the same config.

    Examples
    --------
    >>> measuring_packed_alone()
    False
    """
    from tvm.autotvm.env import GLOBAL_SCOPE

    return bool(GLOBAL_SCOPE.in_tuning)


def tagged_outputs(outs, tag: str) -> Tuple[List[te.Tensor], te.Tensor]:
    """``(outs as a list, the output of the op tagged tag)``: the start of every schedule here.

    Raises
    ------
    ValueError
        When no op reachable from ``outs`` has the tag.
    """
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    found = find_op(outs, tag)
    if found is None:
        raise ValueError(f"no {tag} op among the outputs")
    return outs, found


def inline_between(s: te.Schedule, outs, stop: te.Tensor) -> None:
    """Inline every injective op between the outputs and ``stop`` (exclusive) (iterative).

    Other reductions on the way (a kernel's correction sums) stay stages of their own."""
    stack = [t.op for t in outs]
    seen = set()
    out_ops = {t.op for t in outs}
    while stack:
        op = stack.pop()
        if op in seen or op == stop.op or (isinstance(op, te.ComputeOp) and op.reduce_axis):
            continue
        seen.add(op)
        if isinstance(op, te.ComputeOp) and op not in out_ops:
            s[op].compute_inline()
        stack.extend(t.op for t in op.input_tensors if isinstance(t.op, te.ComputeOp))


def vectorize_inner(s: te.Schedule, tensor: te.Tensor, max_lanes: int = 64) -> None:
    """Vectorize the innermost axis of ``tensor`` when its extent is a small constant."""
    axis = s[tensor].op.axis[-1]
    extent = axis.dom.extent
    if isinstance(extent, tvm.tir.IntImm) and int(extent) <= max_lanes:
        s[tensor].vectorize(axis)
