"""Graph passes that prepare a float Relay model for HWNC tensor cores.

* :func:`count_layers` and :func:`layer_table` number and describe the layers;
* :func:`recast` makes chosen layers compute in another type;
* :class:`LayoutConfig` chooses the conv2d layers ConvertLayout leaves alone
  (the handlers live in :mod:`.convert_layout`, their registration in :mod:`.hooks`);
* :func:`prepare_for_tensorcore` does the whole workflow in one call.

Layer indices mean the same in all of them (see :mod:`._graph`).
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
