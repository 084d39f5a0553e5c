"""The tensor-core section of the demo (see :mod:`tvm_tcutils.demo`)."""
from __future__ import annotations

from typing import Dict, List

from .._tvm import tvm
from tvm import relay


def tensorcore_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Tensor cores: int4/int8 HWNC layers on WMMA kernels for cuda -arch=sm_80 (strategy and AutoTVM)"""
    from tvm import autotvm

    from ..passes import prepare_for_tensorcore
    from . import tensorcore

    lines = []
    batch = 8  # the smallest batch every int4/int8 WMMA shape tiles
    try:
        func = mod["main"]
        data = func.params[0]
        shape = [int(v) for v in data.checked_type.shape]
        new_data = relay.var(data.name_hint, shape=[batch] + shape[1:], dtype=data.checked_type.dtype)
        body = relay.bind(func.body, {data: new_data})
        mod = relay.transform.InferType()(
            tvm.IRModule.from_expr(relay.Function([new_data] + list(func.params[1:]), body))
        )
        lines.append(f"{name} re-batched from {shape[0]} to {batch}")
    except Exception as err:  # models with a hard-coded batch keep theirs
        lines.append(f"{name} keeps its batch ({type(err).__name__}); legalization pads it to the tiles")
    for dtype in ("int4", "int8"):
        # The layers that do not qualify (e.g. a 3-channel stem) stay float NCHW.
        hwnc, skipped = prepare_for_tensorcore(mod, dtype, "int32")
        rows = tensorcore.implementations(hwnc, "cuda -arch=sm_80", ops=("nn.conv2d",))
        ours = [row for row in rows if row[3] == tensorcore.CONV2D_IMPL]
        others = sorted({row[3] for row in rows if row[3] != tensorcore.CONV2D_IMPL})
        workloads = {row[4] for row in ours}
        sizes = [len(autotvm.task.create(w[0], w[1:], "cuda -arch=sm_80").config_space) for w in workloads]
        lines.append(
            f"{dtype}: {len(ours)}/{len(rows)} conv2d layers on {tensorcore.CONV2D_IMPL}, others on "
            f"{', '.join(others) or '-'}; {len(workloads)} AutoTVM tasks, config spaces "
            f"{min(sizes, default=0)}-{max(sizes, default=0)}; prepare_for_tensorcore skipped "
            f"{[layer.index for layer in skipped]}"
        )
    return lines
