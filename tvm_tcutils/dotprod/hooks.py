"""What the int8 dot-product capability installs into TVM (applied by :mod:`tvm_tcutils.registry`).

AutoTVM templates, ``FTVMLegalize`` / ``FTVMAlterOpLayout`` handlers and
strategy rows for int8 ``nn.conv2d``, ``nn.dense`` and the u8 layout
transforms, all declared as data in :mod:`tvm_tcutils.dotprod.strategy`.
"""
from __future__ import annotations

from typing import List

from .. import registry
from . import strategy


def hooks() -> List[registry.Hook]:
    """The dot-product hook declarations.

    Examples
    --------
    >>> sorted({h.kind for h in hooks()})
    ['autotvm_template', 'op_attr', 'strategy']
    """
    return strategy.hooks()
