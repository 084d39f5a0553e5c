"""What the tensor-core capability installs into TVM (applied by :mod:`tvm_tcutils.registry`).

* ``FTVMConvertOpLayout`` for ``nn.conv2d`` and ``qnn.conv2d``
  (:mod:`tvm_tcutils.tensorcore.convert_layout`); TVM's handler runs for every case
  they return None for.
* the CUDA tensor-core templates, strategy rows, legalize and alter-op
  handlers of :mod:`tvm_tcutils.tensorcore.strategy`;
* ``relay.backend.lower_call``: TVM's lowering of each call of a fused function, then, on CUDA
  targets, the element-wise ops after one of the package's GEMM kernels folded into that kernel
  (:mod:`tvm_tcutils.tensorcore.topi.epilogue`); every other call is TVM's alone;
* ``tvm_callback_cuda_postproc`` (:func:`tvm_tcutils.cuda.repair_source`): TVM prints
  the int8 kernels' 16-byte zero fills in a form nvcc rejects; it also puts in front the
  device functions of the next item;
* ``target.build.cuda`` (:func:`tvm_tcutils.cuda_subbyte.lower_subbyte_access`), wherever TVM has
  one (the package's plugin or a CUDA build of TVM): element-wise int4/uint4 reads and
  writes, which TVM prints as whole-word ones, are rewritten to act on their nibble
  before TVM's code generator runs, and the GEMM kernels' store loops are marked for
  nvcc to unroll (:func:`tvm_tcutils.tensorcore.topi.mma_gemm.unroll_in_cuda`); every
  other kernel goes through unchanged;
* while the package's CUDA plugin provides TVM's CUDA code generator,
  ``tvm_callback_cuda_compile`` (:func:`tvm_tcutils.cuda.compile_cuda`: NVRTC or
  nvcc for the target's ``-arch``, no GPU needed); TVM's own callback comes back
  on unregister;
* A ``cpu`` strategy row for ``nn.conv2d`` with ``data_layout == "HWNC"``
  (:mod:`tvm_tcutils.tensorcore.topi.hwnc_reference`): TVM has no CPU implementation of
  that layout; every other layout keeps TVM's implementations.
"""
from __future__ import annotations

import logging
from typing import List

from tvm.relay.backend import te_compiler
from tvm.relay.op.strategy.generic import wrap_topi_schedule
from tvm.topi.utils import get_const_tuple

from .. import cuda, cuda_subbyte, registry
from .._tvm import tvm
from . import strategy
from .convert_layout import HANDLERS
from .topi import epilogue, mma_gemm, wgmma_gemm
from .topi.hwnc_reference import DATA_LAYOUT, conv2d_hwnc, schedule_conv2d_hwnc

logger = logging.getLogger(__name__)

#: The name the QDQ route (``dotprod.qdq.INTEGER_TARGET_FUNC``) asks; spelled here so that neither
#: capability imports the other.
INTEGER_TARGET_FUNC = "tvm_tcutils.qdq.takes_integer_products"


def _compute_conv2d_hwnc(attrs, inputs, out_type) -> list:
    return [
        conv2d_hwnc(
            inputs[0], inputs[1], get_const_tuple(attrs.strides), get_const_tuple(attrs.padding),
            get_const_tuple(attrs.dilation), int(attrs.groups),
            str(attrs.kernel_layout), str(attrs.out_dtype) or str(out_type.dtype),
        )
    ]


def _applies_to_hwnc(attrs, inputs, out_type, target) -> bool:
    return str(attrs.data_layout) == DATA_LAYOUT and sorted(str(attrs.kernel_layout)) == sorted("OIHW")


#: Strategy rows for nn.conv2d on CPU targets.
CPU_CONV2D_ROWS = [
    registry.StrategyImpl(
        name="conv2d_hwnc_reference.cpu",
        fcompute=_compute_conv2d_hwnc,
        fschedule=wrap_topi_schedule(schedule_conv2d_hwnc),
        applies=_applies_to_hwnc,
        plevel=5,
    )
]


def hooks() -> List[registry.Hook]:
    """The hook declarations of the tensor-core capability: graph passes, then CUDA kernels.

    Examples
    --------
    >>> for kind, name in sorted({(hook.kind, hook.name) for hook in hooks()})[:6]:
    ...     print(kind, name)
    autotvm_template tcutils.conv2d_hwnc_mma.cuda
    autotvm_template tcutils.conv2d_hwnc_tensorcore.cuda
    autotvm_template tcutils.dense_mma.cuda
    autotvm_template tcutils.dense_tensorcore.cuda
    autotvm_template tcutils.dense_wgmma.cuda
    op_attr nn.conv2d
    """
    declared = [
        registry.op_attr(op_name, "FTVMConvertOpLayout", handler, description=handler.__doc__.strip())
        for op_name, handler in HANDLERS.items()
    ]
    declared.append(
        registry.strategy(
            "nn.conv2d", CPU_CONV2D_ROWS, targets=["cpu"],
            description="plain HWNC conv2d reference for CPU targets (data_layout HWNC only)",
        )
    )
    if cuda.plugin_loaded():
        declared.append(registry.packed_func(
            "tvm_callback_cuda_compile", _compile_cuda,
            description="CUDA C++ to a cubin for the target's -arch (NVRTC, or nvcc if asked)",
        ))
    build_cuda = tvm.get_global_func("target.build.cuda", allow_missing=True)
    if build_cuda is not None:
        declared.append(registry.packed_func(
            "target.build.cuda", _build_cuda,
            description="element-wise int4/uint4 loads and stores on their nibble, then TVM's CUDA code generator",
        ))
    declared.append(registry.packed_func(
        INTEGER_TARGET_FUNC, lambda target: strategy.takes_integer_products(target),
        description="CUDA targets whose 8-bit dense/batch_matmul the package's GEMMs take (the QDQ route "
                    "makes a quantized model's regions integer for them)",
    ))
    declared.append(registry.packed_func(
        "relay.backend.lower_call", _lower_call,
        description="TVM's lowering of one call of a fused function, then, on CUDA targets, an element-wise "
                    "op after one of the package's GEMMs folded into the GEMM's kernel",
    ))
    declared.append(registry.packed_func(
        "tvm_callback_cuda_postproc", _postproc_cuda,
        description="TVM's 8-bit vector broadcasts (int8 HWNC zero fills) written so that nvcc/NVRTC compile them",
    ))
    return declared + strategy.hooks()


def _lower_call(call, inputs, target, *rest):
    """TVM's ``relay.backend.lower_call`` convention: (call, input tensors, target) -> LoweredOutput.

    TVM's own lowering runs first and its result is returned unchanged unless the target is CUDA and the
    call is an element-wise op on one of the package's GEMM extern ops, which :func:`.topi.epilogue.fold`
    then folds into the GEMM's kernel (the implementation, and so the fused function's schedule, stay
    the anchor's). TVM looks the function up once per process, at its first lowering: a ``relay.build``
    run before ``import tvm_tcutils`` keeps TVM's function (nothing folded: two kernels a layer, as before).
    """
    lower = registry.replaced_func("relay.backend.lower_call")
    if lower is None:
        # Unregistered. TVM's C++ keeps the function it found at its first lowering in the process, so
        # this one may still be called: TVM's own lowering then, and nothing folded.
        return te_compiler.lower_call(call, inputs, target, *rest)
    lowered = lower(call, inputs, target, *rest)
    if (target is None or target.kind.name != "cuda" or len(lowered.outputs) != 1
            or not any(epilogue.foldable(tensor) for tensor in inputs)):
        return lowered
    try:
        folded = epilogue.fold(lowered.outputs[0])
    except (ValueError, TypeError, tvm.TVMError) as err:
        # The layer still builds, as two kernels; the reason is worth a report, not a failed build.
        logger.warning("%s: its epilogue stays a kernel of its own (%s)", call.op.name, err)
        return lowered
    if folded is None:
        return lowered
    return te_compiler.LoweredOutput([folded], lowered.implementation)


def _postproc_cuda(code: str, target) -> str:
    """TVM's ``tvm_callback_cuda_postproc`` convention; a callback registered before the package's runs after it."""
    code = wgmma_gemm.add_helpers(cuda_subbyte.add_helpers(cuda.repair_source(code)))
    previous = registry.replaced_func("tvm_callback_cuda_postproc")
    return str(previous(code, target)) if previous is not None else code


def _build_cuda(mod, target):
    """TVM's ``target.build.cuda`` convention: (device IRModule, target) -> runtime module."""
    build = registry.replaced_func("target.build.cuda")
    if build is None:  # registered while TVM had one, so only an unregister in between gets here
        raise RuntimeError("target.build.cuda: the code generator the package wrapped is gone")
    return build(mma_gemm.unroll_in_cuda(cuda_subbyte.lower_subbyte_access(mod)), target)


def _compile_cuda(code: str, target) -> bytearray:
    """TVM's ``tvm_callback_cuda_compile`` convention: (code, target) -> PTX or cubin."""
    return cuda.compile_cuda(code, target)
