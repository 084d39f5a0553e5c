"""Tensor cores: prepare a Relay model for HWNC int4/int8 tensor cores, and the CUDA kernels that run it.

Graph passes (what a user calls):

* :func:`count_layers` and :func:`layer_table` number and describe the layers;
* :func:`recast` makes chosen layers compute in another type;
* :class:`LayoutConfig` chooses the conv2d layers ConvertLayout leaves alone
  (the handlers live in :mod:`.convert_layout`, their registration in :mod:`.hooks`);
* :func:`prepare_for_tensorcore` does the whole workflow in one call.

Layer indices mean the same in all of them (see :mod:`._graph`).

Below them: :mod:`.rules` (which layers qualify, shared by the passes and the
kernels), :mod:`.topi` (HWNC conv2d and dense WMMA computes and schedules, and a
plain CPU reference), :mod:`.strategy` (strategy rows, legalize and alter-op
functions for CUDA) and :mod:`.hooks` (what :mod:`tvm_tcutils.registry` installs).

Examples
--------
>>> from tvm_tcutils import load_model, tensorcore
>>> mod, _ = load_model("resnet-18")
>>> tensorcore.count_layers(mod, ["nn.conv2d"])
21
"""
from .count_layers import count_layers
from .layer_table import Layer, layer_table
from .layout_config import LayoutConfig
from .prepare import Prepared, SkippedLayer, prepare_for_tensorcore
from .recast import recast

__all__ = [
    "count_layers", "layer_table", "Layer", "recast", "LayoutConfig",
    "prepare_for_tensorcore", "Prepared", "SkippedLayer",
]
