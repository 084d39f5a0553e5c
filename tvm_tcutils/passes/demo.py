"""The graph passes' section of the demo (see :mod:`tvm_tcutils.demo`)."""
from __future__ import annotations

import time
from typing import Dict, List

import numpy as np

from .._tvm import tvm
from tvm import relay

from ._graph import layer_calls, resolve_ops
from .layout_config import LayoutConfig
from .prepare import prepare_for_tensorcore

_HWNC = {"nn.conv2d": ["HWNC", "default"]}


def prepare_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Passes: prepare for HWNC int4 tensor cores; HWNC float model checked on llvm."""
    from ..demo import build_and_time  # the demo module imports this one

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

