"""Pieces shared by the dot-product conv2d and dense schedules."""
from __future__ import annotations

from typing import Callable, List, Mapping, Optional, Sequence, Tuple, Union

from ..._tvm import tvm
from tvm import te

from ...fast_forms import ROUNDING_SHIFTS, float_bits

from ..isa import DotProductISA, TileISA, for_target, range_isa, tile_isa


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


def current_tile_isa(data_dtype: str, kernel_dtype: str) -> TileISA:
    """The current target's tile engine (:func:`~..isa.tile_isa`) that multiplies ``data x kernel``.

    Raises
    ------
    ValueError
        When the target has none (or this process may not use it), or the engine has no such pair.

    Examples
    --------
    >>> import tvm
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     current_tile_isa("uint8", "uint8").name
    'x86_amx'
    """
    target = tvm.target.Target.current(allow_none=True)
    engine = tile_isa(target)
    if engine is None:
        raise ValueError(f"target {target} has no usable AMX tile engine (needs amx-tile and amx-int8)")
    if engine.variant(data_dtype, kernel_dtype) is None:
        native = [(v.data_dtype, v.kernel_dtype) for v in engine.variants]
        raise ValueError(f"{engine.name} cannot multiply {data_dtype} by {kernel_dtype}; native pairs: {native}")
    return engine


#: Bytes below which TVM's lowering leaves a CPU allocation on the stack (its ``kMaxStackAlloca``). A tile's
#: accumulators at or above it go through the workspace allocator once per tile and stay in memory instead
#: of registers (16 zmm accumulators of a batch_matmul tile: 529 GOPS, against 835 with 12, on Zen 5).
STACK_ALLOCA_BYTES = 1024


#: Independent accumulator chains that keep a 4-way dot-product unit busy despite its latency: a register-only
#: loop of ``vpdpbusd`` (``bench.int8.peak_gops``) reaches 91 % of its best with 8 chains on Zen 5, 99 % with 12.
LATENCY_CHAINS = 12


def register_accumulators(lanes: int, budget: int) -> int:
    """Most int32 accumulator vectors of ``lanes`` a tile may have and still live in registers: at most
    ``budget`` and under :data:`STACK_ALLOCA_BYTES`.

    Examples
    --------
    >>> register_accumulators(16, 24), register_accumulators(8, 6)  # 512-bit (VNNI), 256-bit (AVX2)
    (15, 6)
    """
    return max(1, min(budget, (STACK_ALLOCA_BYTES - 1) // (4 * lanes)))


def register_tile(m: int, blocks: int, lanes: int, budget: int) -> Tuple[int, int]:
    """``(tile_m, tile_nb)``: up to 4 of ``blocks`` (a divisor) by as many of ``m`` rows as keep the
    accumulators in registers (:func:`register_accumulators`).

    Examples
    --------
    >>> register_tile(128, 8, 16, 24), register_tile(128, 2, 16, 24)
    ((3, 4), (7, 2))
    """
    tile_nb = divisors_up_to(blocks, 4)[-1]
    return min(m, max(1, register_accumulators(lanes, budget) // tile_nb)), tile_nb


def limit_tile_space(cfg, accumulators: Callable[[Mapping], int],
                     limit: Union[int, Callable[[Mapping], int]]) -> None:
    """Keep ``cfg``'s tuning space to tiles of at most ``limit`` accumulator vectors.

    ``accumulators`` counts a point's vectors from its knob entities; ``limit`` is a number or, where the
    registers left depend on the point (operands of more output blocks), a function of the entities too.
    The knobs alone span products far past what registers hold (a 15 x 16 dense tile): a trial of such a
    tile is spent on a config that spills or lives in memory. Callers pass a ``limit`` no lower than their
    untuned tile's, which the tuner measures first (:func:`tvm_tcutils.tuning.default_config_index` must
    find it in the space). A config being applied (not collected) is unaffected.

    Examples
    --------
    >>> from tvm import autotvm
    >>> space = autotvm.task.space.ConfigSpace()
    >>> for name, values in [("tile_m", [1, 2, 4, 8]), ("tile_nb", [1, 2, 4])]:
    ...     _ = space.define_knob(name, values)
    >>> limit_tile_space(space, lambda e: e["tile_m"].val * e["tile_nb"].val, 8)
    >>> len(space), space.range_length
    (9, 12)
    """
    bound = limit if callable(limit) else (lambda entities: limit)
    cfg.multi_filter(filter=lambda entities: accumulators(entities) <= bound(entities))


def limit_row_tiles(cfg, lanes: int, budget: int, untuned: Tuple[int, int]) -> None:
    """:func:`limit_tile_space` for a ``tile_m`` x ``tile_nb`` tile of ``lanes``-lane accumulators (dense,
    batch_matmul): as many as stay in registers (:func:`register_accumulators`), or the ``untuned`` tile's."""
    limit_tile_space(cfg, lambda e: e["tile_m"].val * e["tile_nb"].val,
                     max(register_accumulators(lanes, budget), untuned[0] * untuned[1]))


def divisors_up_to(n: int, limit: int) -> List[int]:
    """Divisors of ``n`` not above ``limit``, ascending.

    Examples
    --------
    >>> divisors_up_to(28, 8)
    [1, 2, 4, 7]
    """
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def flipped(value, dtype: str, stored: str):
    """``value`` of ``dtype`` with its sign bit flipped into ``stored`` (unchanged when equal).

    Examples
    --------
    >>> from tvm import tir
    >>> flipped(tir.const(3, "uint8"), "uint8", "int8").dtype
    'int8'
    """
    if dtype == stored:
        return value
    return (value.astype("int32") + (128 if stored == "uint8" else -128)).astype(stored)


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


#: Name of the epilogue :func:`requantized` appends (the schedules recognize a tuning task by it).
REQUANTIZED = "requantized"


def requantized(product: te.Tensor, channel_axes: Sequence[int]) -> te.Tensor:
    """A packed product's int32 output requantized to uint8 per output channel, as a quantized network's
    kernel ends (bias, float scale, clip, rounding by a float add, cast; the epilogue the package's QDQ
    legalization fuses into it): what a tuner measures, since the epilogue changes which tiling is fastest
    (ResNet-18's 1x1 conv at 28x28: the config measured x1.7 faster than the fallback without the epilogue
    ran 1.9 times as long as the fallback in the network; BERT-base's 768x768 projection: one measured 3 %
    faster ran 7-14 % slower). ``channel_axes`` are the output's axes that name a channel (a conv's block
    and lane axes, a dense's column); its ``bias`` (int32) and ``scale`` (float32) inputs have their shape.

    Examples
    --------
    >>> c = te.placeholder((1, 2, 4, 4, 16), "int32", name="conv")
    >>> out = requantized(c, (1, 4))
    >>> out.dtype, [int(d) for d in out.shape], sorted(t.name for t in out.op.input_tensors)
    ('uint8', [1, 2, 4, 4, 16], ['bias', 'conv', 'scale'])
    >>> [int(d) for d in requantized(te.placeholder((8, 32), "int32"), (1,)).op.input_tensors[1].shape]
    [32]
    """
    channels = [int(product.shape[axis]) for axis in channel_axes]
    bias = te.placeholder(channels, "int32", name="bias")
    scale = te.placeholder(channels, "float32", name="scale")
    shift = ROUNDING_SHIFTS[0]  # the float add that rounds, as fast_forms.rounded_int32 writes it
    magic = tvm.tir.const(shift, "float32")
    offset = tvm.tir.const(-float_bits(shift), "int32")

    def epilogue(*index):
        channel = [index[axis] for axis in channel_axes]
        value = (product(*index) + bias(*channel)).astype("float32") * scale(*channel)
        value = te.max(te.min(value, tvm.tir.const(255.0, "float32")), tvm.tir.const(0.0, "float32"))
        return (tvm.tir.reinterpret("int32", value + magic) + offset).astype("uint8")

    return te.compute(product.shape, epilogue, name=REQUANTIZED, tag="elemwise")


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
