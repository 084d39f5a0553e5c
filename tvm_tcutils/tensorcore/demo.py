"""The tensor-core sections of the demo (see :mod:`tvm_tcutils.demo`): preparing a model, and the CUDA kernels."""
from __future__ import annotations

import time
from typing import Dict, List

import numpy as np

from .._tvm import tvm
from tvm import relay

from ..measure import build_and_time

from ._graph import layer_calls, resolve_ops
from .layout_config import LayoutConfig
from .prepare import prepare_for_tensorcore

_HWNC = {"nn.conv2d": ["HWNC", "default"]}


def prepare_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Passes: prepare for HWNC int4 tensor cores; HWNC float model checked on llvm."""
    start = time.perf_counter()
    prepared, skipped = prepare_for_tensorcore(mod, "int4")
    seconds = time.perf_counter() - start
    converted = sum(str(call.attrs.data_layout) == "HWNC" for call in layer_calls(prepared, resolve_ops(_HWNC, "ops")))
    lines = [
        f"prepare_for_tensorcore(int4): {converted} conv2d layers to HWNC/int4 in {seconds:.1f} s, "
        f"{len(skipped)} skipped",
        *(f"  skipped {layer}" for layer in skipped),
    ]
    with LayoutConfig(skip_layers=[layer.index for layer in skipped]), tvm.transform.PassContext(opt_level=3):
        hwnc = relay.transform.ConvertLayout(_HWNC)(mod)
    reference, _, ref_ms = build_and_time(mod, params, repeat=1)
    outputs, build_s, ms = build_and_time(hwnc, params, repeat=1)
    error = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs, reference))
    scale = max(float(np.max(np.abs(r))) for r in reference)
    lines.append(
        f"HWNC float model on llvm (plain reference conv2d): max |diff| {error:.2e} vs outputs up to "
        f"{scale:.2f}; {ms:.1f} ms vs {ref_ms:.1f} ms in NCHW"
    )
    return lines


def tensorcore_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Tensor cores: int4/int8 HWNC layers on WMMA kernels for cuda -arch=sm_80 (strategy and AutoTVM)"""
    from tvm import autotvm

    from . import strategy as tensorcore

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
    except (tvm.TVMError, TypeError, ValueError, IndexError) as err:  # models with a hard-coded batch keep theirs
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
