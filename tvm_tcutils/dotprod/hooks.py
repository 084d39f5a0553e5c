"""What the int8 dot-product capability installs into TVM (applied by :mod:`tvm_tcutils.registry`).

AutoTVM templates, ``FTVMLegalize`` / ``FTVMAlterOpLayout`` handlers and
strategy rows for int8 ``nn.conv2d``, ``nn.dense``, ``nn.batch_matmul`` (which
``qnn.batch_matmul`` lowers to) and the u8 layout transforms, all declared as
data in :mod:`tvm_tcutils.dotprod.strategy`. With them no int8 op reaches TVM
0.19's own x86 int8 intrinsics (``python_tests/dotprod/test_int8_op_sweep.py``
checks every int8 / QNN op on VNNI, AVX-512BW, AVX2 and SSE targets). Also the packed function
:data:`~tvm_tcutils.prebuild.PREBUILD_FUNC`, through which :func:`tvm_tcutils.measure.build` and
:func:`tvm_tcutils.tuning.extract_tasks` turn QDQ models into integer ops (:mod:`.qdq`) for targets with
a dot-product ISA, and the ``FTVMQnnLegalize`` handlers of ``qnn.quantize`` (:func:`.qdq.legalize_quantize`)
through which plain ``relay.build`` does the same, and of ``qnn.requantize`` (:func:`.qdq.legalize_requantize`),
which gives QOperator files the same arithmetic. And ``target.build.llvm``, wrapped: the dot-product
kernels' tile loops software-pipelined (:mod:`.pipeline`) and their next weight blocks prefetched
(:mod:`.prefetch`), every function's vector lets substituted (:func:`vector_lets_inlined`: LLVM 22 refuses
their debug information), then TVM's LLVM code generator.
"""
from __future__ import annotations

from typing import List

from .._tvm import tvm
from .. import fast_forms, float_batch_matmul, registry
from ..prebuild import PREBUILD_FUNC  # (mod, target) -> mod, applied before builds and task extraction
from . import pipeline, prefetch, qdq, rounding, strategy, tile_epilogue
from .topi.tiles import STEP_INDEX, STEP_STRIP

#: TVM's code generator for CPU targets, which :func:`_build_llvm` delegates to.
BUILD_LLVM = "target.build.llvm"


def hooks() -> List[registry.Hook]:
    """The dot-product hook declarations.

    Examples
    --------
    >>> sorted({h.kind for h in hooks()})
    ['autotvm_template', 'op_attr', 'packed_func', 'relay_op', 'strategy']
    """
    declared = []
    if tvm.get_global_func(BUILD_LLVM, allow_missing=True) is not None:
        declared.append(registry.packed_func(
            BUILD_LLVM, _build_llvm,
            description="dot-product tile loops with the previous tile's epilogue among the products "
                        "(dotprod.pipeline), the next weight block prefetched (dotprod.prefetch), roundings "
                        "back to float as nearbyint (dotprod.rounding), then TVM's LLVM code generator"))
    return declared + strategy.hooks() + [
        registry.packed_func(
            PREBUILD_FUNC, lambda mod, target: qdq.prepare_for_target(mod, str(target)),
            description="QDQ regions as integer qnn ops for targets with a dot-product ISA (dotprod.qdq)"),
        # The same rewrite inside plain relay.build, region by region (TVM's first pass).
        registry.op_attr(
            "qnn.quantize", "FTVMQnnLegalize", qdq.legalize_quantize, targets=(*strategy.TARGET_KEYS, "cuda"),
            description="a QDQ region as the integer ops to_integer makes (plain relay.build, dotprod.qdq)"),
        # Before TVM's Hexagon legalization, which pads a depthwise conv's channels into an invalid grouped one.
        registry.op_attr(
            "qnn.conv2d", "FTVMQnnLegalize", qdq.legalize_grouped_conv2d, targets=(qdq.PADDING_KEY,),
            description="a grouped (depthwise) qnn.conv2d left unpadded on Hexagon (TVM's padding breaks it)"),
        # A padded depthwise conv's data copied once: the zero-point padding adds what the 4-tap rows read.
        registry.op_attr(
            "qnn.conv2d", "FTVMQnnLegalize", qdq.legalize_depthwise_padding, targets=strategy.TARGET_KEYS,
            description="a padded u8 x i8 depthwise conv's zero-point padding widened for the depthwise kernel's "
                        "whole-quad rows, its kernel given the zero taps (one copy of the data, not two)"),
        # A grouped conv of 8-bit operands (TVM's canonical form widens both to int32 for it).
        registry.op_attr(
            "qnn.conv2d", "FTVMQnnLegalize", qdq.legalize_group_conv2d, targets=strategy.TARGET_KEYS,
            description="a grouped (not depthwise) qnn.conv2d as a conv of its 8-bit operands and a zero-point "
                        "term, for the grouped dot-product kernel (TVM widens both operands to int32)"),
        # QOperator files' per-channel kernel zero points that are all equal (0): a scalar, no data sums.
        *[registry.op_attr(
            op, "FTVMQnnLegalize", qdq.legalize_uniform_zero_point, targets=strategy.TARGET_KEYS,
            description="a constant per-channel kernel zero point of equal values as a scalar (dotprod.qdq)")
          for op in ("qnn.conv2d", "qnn.dense")],
        # A quantized model's layer norms (mean, variance) in one pass: TVM sums a row serially.
        registry.op_attr(
            "mean", "FTVMQnnLegalize", fast_forms.legalize_mean, targets=strategy.TARGET_KEYS,
            description="a quantized model's row mean from one vectorized pass of row moments (fast_forms)"),
        registry.op_attr(
            "variance", "FTVMQnnLegalize", fast_forms.legalize_variance, targets=strategy.TARGET_KEYS,
            description="a quantized model's row variance from the same row moments (fast_forms)"),
        # A quantized model's float products of two activations: TVM's x86 batch_matmul runs them slowly.
        registry.op_attr(
            "nn.batch_matmul", "FTVMQnnLegalize", fast_forms.legalize_batch_matmul, targets=strategy.TARGET_KEYS,
            description="a quantized model's float32 batch_matmul as one packed float dense per batch (fast_forms)"),
        # Its op for x86 targets: one kernel parallel over the heads instead of a dense per head.
        registry.relay_op(
            **float_batch_matmul.op_declaration(),
            description="a quantized model's float32 batch_matmul by one kernel parallel over batches and row "
                        "blocks (float_batch_matmul)"),
        registry.strategy(float_batch_matmul.OP_NAME, float_batch_matmul.strategy_impls(), targets=("cpu",)),
        # QOperator files' requantizations with the same (onnxruntime's) arithmetic.
        registry.op_attr(
            "qnn.requantize", "FTVMQnnLegalize", qdq.legalize_requantize, targets=strategy.TARGET_KEYS,
            description="an int32 accumulator requantized as onnxruntime does it (float32, half to even)"),
    ]


def _rewritable(func) -> bool:
    """Whether a rewrite of :func:`_build_llvm` may change ``func`` (a ``tir.PrimFunc``): it calls a product
    instruction (a dot-product step or a tile product), or holds a tile program's step marks (the reference
    form's tiles are plain TIR, their epilogues moved in all the same)."""
    if pipeline.product_isas(func.body):
        return True
    marks = []
    # ir_transform calls back for attribute statements only (a post-order visit would for every node).
    tvm.tir.stmt_functor.ir_transform(func.body, None, lambda node: marks.append(1) if node.attr_key in (
        STEP_STRIP, STEP_INDEX) else None, ["tir.AttrStmt"])
    return bool(marks)


def vector_lets_inlined(func):
    """``func`` (a ``tir.PrimFunc``) with each vector-typed ``LetStmt`` of a value that reads no memory
    substituted into its body; the same function where it has none.

    TVM's common-subexpression pass binds vector index expressions (a fused layout transform's ramps) to
    such lets, and TVM's LLVM code generator declares each let's debug information on the value itself,
    which LLVM 22's verifier refuses for a vector ("location of #dbg_declare must be a pointer or int"):
    the build failed. Substituted, the expressions are computed where they are used (LLVM's own CSE
    merges them again); a value that loads from a buffer is left bound (a later store could change it).

    Examples
    --------
    >>> from tvm import tir
    >>> v, x = tir.Var("v", "int32x4"), tir.Var("x", "int32")
    >>> buf = tir.decl_buffer((4,), "int32", "b")
    >>> ramp = tir.Ramp(tir.shift_right(x, 2), 1, 4)
    >>> body = tir.LetStmt(v, ramp, tir.BufferStore(buf, v + v, [tir.Ramp(0, 1, 4)]))
    >>> func = vector_lets_inlined(tir.PrimFunc([x], body))
    >>> isinstance(func.body, tir.LetStmt), "ramp" in str(func.body).lower()
    (False, True)
    """
    tir = tvm.tir

    def impure(node) -> bool:  # a load, or a call with effects (TVM's call effect kinds: 1 is pure)
        if isinstance(node, tir.BufferLoad):
            return True
        if not isinstance(node, tir.Call):
            return False
        effect = node.op.get_attr("TCallEffectKind") if isinstance(node.op, tvm.ir.Op) else None
        return effect is None or int(effect) > 1

    def reads_memory(value) -> bool:
        found = []
        tir.stmt_functor.post_order_visit(value, lambda node: found.append(1) if impure(node) else None)
        return bool(found)

    def inline(stmt):
        if tvm.runtime.DataType(stmt.var.dtype).lanes > 1 and not reads_memory(stmt.value):
            return tir.stmt_functor.substitute(stmt.body, {stmt.var: stmt.value})
        return None

    body = tir.stmt_functor.ir_transform(func.body, None, inline, ["tir.LetStmt"])
    return func if body.same_as(func.body) else func.with_body(body)


def _build_llvm(mod, target):
    """TVM's ``target.build.llvm`` convention: (host IRModule, target) -> runtime module."""
    build = registry.replaced_func(BUILD_LLVM)
    if build is None:
        raise RuntimeError(f"{BUILD_LLVM}: the code generator the package wrapped is gone")
    # Every module: a float model's fused layout transforms bind vector lets too (one C++ walk each).
    functions = {gv: vector_lets_inlined(f) if isinstance(f, tvm.tir.PrimFunc) else f
                 for gv, f in mod.functions.items()}
    if any(not functions[gv].same_as(f) for gv, f in mod.functions.items()):
        mod = tvm.IRModule(functions, attrs=mod.attrs)
    # A module none of the rewrites below can change (a float model's kernels) is built as it is, without
    # their five walks over each function (10 % of a float conv's whole relay.build; Collage builds thousands).
    if not any(_rewritable(func) for func in mod.functions.values() if isinstance(func, tvm.tir.PrimFunc)):
        return build(mod, target)
    # Prefetches and rounding first: the pipelined kernels' unrolled bodies are slow to analyse; the
    # pipelining carries the hints along with the product steps.
    mod = tile_epilogue.interleave_module(mod)
    return build(pipeline.pipeline_module(rounding.rounding_module(prefetch.prefetch_module(mod), target)), target)
