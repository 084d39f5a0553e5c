"""tvm-tcutils: tensor-core preparation, int8 dot-product schedules and Collage for Apache TVM.

Importing the package checks the installed TVM (see :mod:`tvm_tcutils._tvm`)
and installs the package's hooks into TVM's registries once (see
:mod:`tvm_tcutils.registry`).
"""
from __future__ import annotations

from ._tvm import TESTED_TVM_VERSIONS, host_target  # noqa: F401  (checks TVM first)
from . import processes  # noqa: F401  (records the CPUs this process was given: processes.CPUS_ENV)
from . import _compat, _moved
from .installation import capabilities  # noqa: F401
from .models import ModelError, load_model, save_model  # noqa: F401
from .tensorcore import LayoutConfig, count_layers, layer_table, prepare_for_tensorcore, recast  # noqa: F401
from .registry import register, registered, unregister  # noqa: F401

__version__ = "0.1.0"

_moved.install()
_compat.install_onnx_shim()
_compat.install_onnx_converters()
_compat.install_cached_libinfo()
register()
