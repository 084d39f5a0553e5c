"""The ``openvino`` and ``openvino-bf16`` toolchains: OpenVINO's CPU runtime as a BYOC compiler.

Graph style, like :mod:`.ort`: a partition marked ``Compiler="tcutils_openvino"``
(or ``"tcutils_openvino_bf16"``) is written as ONNX by the package's converter
(:mod:`.relay_to_onnx`) in the external codegen ``relay.ext.<compiler>``, which
returns a runtime module (:class:`.packed_call.PackedToolchain`) embedding the
model. The first call in a process reads the model and compiles it once with
``openvino.Core().compile_model(..., "CPU")``; every call then runs one infer
request on the executor's own buffers: its input and output tensors are
``openvino.Tensor`` objects sharing their memory (``shared_memory=True``), so no
tensor is copied on the way in or out. Large weights are not embedded: they are
lifted into the caller's parameters (:func:`.packed_call.lift_constants`) and
become constants of the model (in place of its inputs) before it is compiled.

The two toolchains differ in OpenVINO's ``INFERENCE_PRECISION_HINT`` only:

=================  ===================  ===============================================
toolchain          precision hint       numerics (checked by the tests)
=================  ===================  ===============================================
``openvino``       ``f32``              as TVM's: ``rtol = atol = 1e-4``
``openvino-bf16``  ``bf16``             :data:`BF16_TOLERANCE` (matmuls, convolutions in
                                        bf16); only where the CPU has native bf16
                                        (``BF16`` among OpenVINO's ``OPTIMIZATION_CAPABILITIES``)
=================  ===================  ===============================================

Quantized models: the claim is the converter's, ``qnn.quantize`` /
``qnn.dequantize`` included, and partitions may take and return int8 / uint8
tensors (``openvino.Tensor`` views of the executor's buffers, of their element
type). OpenVINO reads ``QuantizeLinear`` / ``DequantizeLinear`` as its
``FakeQuantize`` / convert-subtract-multiply and runs the regions between them
in int8 where its low-precision transformations apply. Its numbers: ``quantize``
as onnxruntime's (ties to even, see :mod:`.relay_to_onnx`), ``dequantize``
within a float32 rounding of TVM's (it multiplies in another order), so int8
partitions match TVM within a quantization step, as onnxruntime's do.

Settings (environment): ``TVM_TCUTILS_OPENVINO_THREADS`` sets OpenVINO's
``INFERENCE_NUM_THREADS`` (default: as many as TVM's thread pool, the budget
onnxruntime gets too; see :func:`openvino_threads`).

Install with ``pip install 'tvm-tcutils[openvino]'``; without it the toolchains
are left out of the default search with a warning, and naming them is an error
that says what to install.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import threading
from typing import Dict, List, Optional, Tuple

from ..._tvm import tvm
from tvm import relay

from ... import registry
from . import ort
from .base import Toolchain, relative_error, thread_budget
from .packed_call import (
    LIFTING_COMPILERS, PackedToolchain, byoc_partition, function_of, missing_modules, modules_present, tensor_data,
    tensor_view,
)

#: Python modules the toolchains need.
REQUIRED_MODULES = ("openvino", "onnx")

#: What to install when they are missing.
INSTALL_HINT = "pip install 'tvm-tcutils[openvino]'"

#: bf16 results against TVM's f32 ones: ``|out - ref| <= atol + rtol * |ref|`` elementwise, for
#: operands of magnitude about 1 and reductions of up to a few hundred terms. bf16 keeps 8
#: significant bits (relative rounding 2**-9 = 0.2%); OpenVINO rounds the operands of matmuls and
#: convolutions (and of element-wise ops between them) and accumulates in f32.
BF16_TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}

#: bf16 results of more than one op (a partition of two convolutions, a 256-term batch_matmul on
#: normal inputs) hold a few outliers beyond :data:`BF16_TOLERANCE` (0.01-0.3 % of the elements on
#: squeezenet1.1, bert-tiny-onnx and the encoder's batch_matmul), where the reference is near zero;
#: they are judged as a whole: ``||out - ref|| <= BF16_RELATIVE_ERROR * ||ref||`` (:func:`bf16_error`).
BF16_RELATIVE_ERROR = 2e-2


def bf16_error(got, want) -> float:
    """``||got - want|| / ||want||``: the error measure of bf16 results (:data:`BF16_RELATIVE_ERROR`), as
    error budgets measure outputs (:func:`~.base.relative_error`).

    Examples
    --------
    >>> import numpy as np
    >>> want = np.ones(100); got = want.copy(); got[0] = 1.1   # one outlier of 10 %
    >>> round(bf16_error(got, want), 3), bf16_error(got, want) <= BF16_RELATIVE_ERROR
    (0.01, True)
    """
    return relative_error([got], [want])


#: f32 results against TVM's: the accumulation order differs, nothing else.
F32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


@dataclasses.dataclass(frozen=True)
class Precision:
    """One OpenVINO inference precision offered as its own toolchain.

    Parameters
    ----------
    toolchain : str
        Collage name of the toolchain.
    compiler : str
        BYOC compiler name (``Compiler`` attribute, ``relay.ext.<compiler>``).
    hint : str
        OpenVINO's ``INFERENCE_PRECISION_HINT``.
    capability : str or None
        Entry of the CPU's ``OPTIMIZATION_CAPABILITIES`` the precision needs.
    tolerance : dict
        ``rtol`` / ``atol`` of its results against TVM's f32 ones.
    """

    toolchain: str
    compiler: str
    hint: str
    capability: Optional[str]
    tolerance: Dict[str, float]

    @property
    def packed_name(self) -> str:
        """Short name of its packed functions (``tvm_tcutils.<packed_name>.run``)."""
        return self.compiler.removeprefix("tcutils_")


#: The precisions, by OpenVINO's name for them.
PRECISIONS: Dict[str, Precision] = {
    "f32": Precision("openvino", "tcutils_openvino", "f32", None, F32_TOLERANCE),
    "bf16": Precision("openvino-bf16", "tcutils_openvino_bf16", "bf16", "BF16", BF16_TOLERANCE),
}

#: BYOC compiler name of the f32 toolchain.
COMPILER = PRECISIONS["f32"].compiler

LIFTING_COMPILERS.update(spec.compiler for spec in PRECISIONS.values())

#: Operators the ONNX converter handles that OpenVINO does not run as Relay means them, and why.
#: Everything else in :data:`relay_to_onnx.CONVERTERS` is claimed (each with a numerics test).
NOT_RUN: Dict[str, str] = {}


def _installed() -> bool:
    """Cheap check (no import) that the required modules are present."""
    return modules_present(REQUIRED_MODULES)


def _missing_reason() -> str:
    missing = missing_modules(REQUIRED_MODULES)
    return f"{' and '.join(missing) or 'openvino'} not installed; install with: {INSTALL_HINT}"


_CORE_LOCK = threading.Lock()
_CORE: list = []  # the process's one openvino.Core (creating one loads the plugins' registry)


def _core():
    with _CORE_LOCK:
        if not _CORE:
            _CORE.append(importlib.import_module("openvino").Core())
        return _CORE[0]


def capabilities() -> Tuple[str, ...]:
    """OpenVINO's ``OPTIMIZATION_CAPABILITIES`` of this CPU (``()`` where OpenVINO is missing).

    Examples
    --------
    >>> caps = capabilities()
    >>> caps == () or "FP32" in caps
    True
    """
    if not _installed():
        return ()
    try:
        return tuple(str(c) for c in _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    except (ImportError, OSError, RuntimeError):  # a broken install, or no CPU plugin
        return ()


def available(precision: str = "f32") -> Tuple[bool, str]:
    """Whether OpenVINO can run partitions here in ``precision``, and why not.

    Parameters
    ----------
    precision : str
        A key of :data:`PRECISIONS` (``"f32"`` or ``"bf16"``).

    Returns
    -------
    (bool, str)
        ``(True, "openvino <version>, <precision>")`` or ``(False, reason)``.

    Examples
    --------
    >>> ok, reason = available("f32")
    >>> ok == reason.startswith("openvino 20")
    True
    """
    spec = PRECISIONS[precision]
    if not _installed():
        return False, _missing_reason()
    try:
        ov = importlib.import_module("openvino")
        caps = _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except (ImportError, OSError, RuntimeError) as err:  # a broken install is as unusable as a missing one
        return False, f"openvino does not work here ({err}); reinstall it with: {INSTALL_HINT}"
    if spec.capability is not None and spec.capability not in caps:
        return False, (f"this CPU has no native {precision} in OpenVINO (OPTIMIZATION_CAPABILITIES: "
                       f"{', '.join(caps)}); needs AVX512-BF16 or AMX")
    return True, f"openvino {ov.__version__.split('-')[0]}, {precision}"


def _require(precision: str) -> None:
    ok, reason = available(precision)
    if not ok:
        raise RuntimeError(f"toolchain {PRECISIONS[precision].toolchain} is unavailable: {reason}")


def openvino_threads() -> int:
    """OpenVINO's inference threads: ``TVM_TCUTILS_OPENVINO_THREADS``, else as many as TVM's pool has
    (:func:`~.base.thread_budget`: the same budget as TVM's and onnxruntime's).

    Examples
    --------
    >>> openvino_threads() >= 1
    True
    """
    return thread_budget("TVM_TCUTILS_OPENVINO_THREADS")


def compile_config(precision: str = "f32") -> Dict[str, object]:
    """The properties a partition is compiled with.

    Examples
    --------
    >>> compile_config("bf16")["INFERENCE_PRECISION_HINT"]
    'bf16'
    """
    return {
        "INFERENCE_PRECISION_HINT": PRECISIONS[precision].hint,
        "INFERENCE_NUM_THREADS": openvino_threads(),
        # One request at a time from the executor: one stream, tuned for latency.
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        # TVM's pool threads share the cores; pinned OpenVINO threads could sit on a busy one.
        "ENABLE_CPU_PINNING": False,
    }


def pattern_table(precision: str = "f32") -> List[tuple]:
    """ONNX Runtime's patterns (every operator call the ONNX converter handles) under
    this toolchain's compiler name, less the operators of :data:`NOT_RUN`.

    Examples
    --------
    >>> names = [name for name, _, _ in pattern_table()]
    >>> "tcutils_openvino.nn.conv2d" in names, "tcutils_openvino.qnn.quantize" in names
    (True, True)
    """
    compiler = PRECISIONS[precision].compiler
    table = []
    for name, pattern, predicate in ort.pattern_table():
        op_name = name.removeprefix(f"{ort.COMPILER}.")
        if op_name not in NOT_RUN:
            table.append((f"{compiler}.{op_name}", pattern, predicate))
    return table


class _Compiled:
    """One embedded model compiled for the CPU, with its infer request bound to the last buffers seen."""

    def __init__(self, payload: bytes, precision: str, weights: List = ()):
        ov = importlib.import_module("openvino")
        core = _core()
        self._tensor = ov.Tensor
        payload = ort.resolve_payload(payload)
        model = _with_constants(core.read_model(payload, b""), ort.lifted_names(payload), weights)
        self.compiled = core.compile_model(model, "CPU", compile_config(precision))
        del model  # the compiled model keeps its own (reordered) weights
        self.request = self.compiled.create_infer_request()
        self.num_data = len(self.compiled.inputs)
        # The executor passes the lifted weights after the inputs; only the inputs are bound.
        self.num_inputs = self.num_data + len(weights)
        self.num_outputs = len(self.compiled.outputs)
        self.bound: Optional[tuple] = None
        # An infer request runs one inference at a time.
        self.lock = threading.Lock()

    def run(self, inputs: List[int], outputs: List[int]) -> None:
        if len(outputs) != self.num_outputs:
            raise ValueError(f"OpenVINO partition: {len(outputs)} output tensors for {self.num_outputs} results")
        inputs = inputs[:self.num_data]
        pointers = tuple(tensor_data(address) for address in inputs + outputs)
        with self.lock:
            # Executors reuse their buffers: rebinding happens when they change (another executor).
            if pointers != self.bound:
                for i, address in enumerate(inputs):
                    self.request.set_input_tensor(i, self._tensor(tensor_view(address), shared_memory=True))
                for i, address in enumerate(outputs):
                    self.request.set_output_tensor(i, self._tensor(tensor_view(address), shared_memory=True))
                self.bound = pointers
            self.request.infer(share_outputs=True)


def _with_constants(model, names: List[str], weights: List):
    """``model`` with its parameters ``names`` replaced by constants holding copies of ``weights``."""
    if len(names) != len(weights):
        raise ValueError(f"the model has {len(names)} lifted weights, {len(weights)} were given")
    if not names:
        return model
    opset = importlib.import_module("openvino.opset13")
    by_name = {param.get_friendly_name(): param for param in model.get_parameters()}
    for name, weight in zip(names, weights):
        param = by_name[name]
        constant = opset.constant(weight, shared_memory=False)  # a copy: the weight is a view of the caller's
        for target in list(param.output(0).get_target_inputs()):
            target.replace_source_output(constant.output(0))
        model.remove_parameter(param)
    model.validate_nodes_and_infer_types()
    return model


def _toolchain(precision: str) -> PackedToolchain:
    def prepare(payload: bytes, weights: List = ()) -> _Compiled:
        _require(precision)
        return _Compiled(payload, precision, weights)

    def execute(state: _Compiled, inputs: List[int], outputs: List[int]) -> None:
        state.run(inputs, outputs)

    return PackedToolchain(PRECISIONS[precision].packed_name, prepare, execute)


#: The packed functions ``tvm_tcutils.<openvino|openvino_bf16>.run`` / ``.load``, by precision.
TOOLCHAINS: Dict[str, PackedToolchain] = {precision: _toolchain(precision) for precision in PRECISIONS}


def compile_function(func: relay.Function, precision: str = "f32") -> "tvm.runtime.Module":
    """External codegen ``relay.ext.tcutils_openvino[_bf16]``: a Relay function to a runtime module.

    Parameters
    ----------
    func : relay.Function
        A partition (``global_symbol`` set) of operators and composite
        functions that :func:`relay_to_onnx.supported` accepts.
    precision : str
        ``"f32"`` or ``"bf16"``.

    Returns
    -------
    tvm.runtime.Module
        A module exporting the function's ``global_symbol``; OpenVINO compiles
        the embedded model at its first call in a process.

    Examples
    --------
    >>> import numpy as np
    >>> x = relay.var("x", shape=(1, 8))
    >>> f = relay.Function([x], relay.tanh(x)).with_attr("global_symbol", "ov_0")
    >>> mod = compile_function(f)
    >>> out = tvm.nd.empty((1, 8))
    >>> mod["ov_0"](tvm.nd.array(np.zeros((1, 8), "float32")), out)
    >>> out.numpy().tolist()[0][:3]
    [0.0, 0.0, 0.0]
    """
    _require(precision)
    func = function_of(func)
    # Lifted weights stay graph inputs in the ONNX model: OpenVINO reads no external data from memory.
    return TOOLCHAINS[precision].build_module(func, ort.payload_of(func, externalize=False))


def partition_for(mod: tvm.IRModule, params=None, precision: str = "f32") -> tvm.IRModule:
    """Greedy BYOC partitioning: every maximal region of claimed operators goes to OpenVINO.

    ``mod`` is not modified; ``params`` are bound as constants first.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 8))
    >>> mod = tvm.IRModule.from_expr(relay.tanh(relay.nn.relu(x)))
    >>> sorted(str(gv.name_hint) for gv in partition_for(mod).get_global_vars())
    ['main', 'tvmgen_default_tcutils_openvino_main_0']
    """
    return byoc_partition(mod, PRECISIONS[precision].compiler, params, merge=True)


@dataclasses.dataclass(frozen=True)
class OpenVinoToolchain(Toolchain):
    """A Collage toolchain of OpenVINO at one precision: available only where it runs here.

    Examples
    --------
    >>> TOOLCHAIN_F32.compiler
    'tcutils_openvino'
    """

    def availability(self) -> Tuple[bool, str]:
        """``(True, "")`` when OpenVINO runs this precision here, else ``(False, reason)``;
        a missing install names the extra to install."""
        if not _installed():
            return False, _missing_reason()
        ok, reason = available(self.precision)
        if not ok:
            return False, reason
        return super().availability()

    def cache_tag(self) -> str:
        """The base tag, plus the precision and an explicit thread setting."""
        setting = os.environ.get("TVM_TCUTILS_OPENVINO_THREADS", "")
        return "/".join([super().cache_tag(), self.precision,
                         *([f"TVM_TCUTILS_OPENVINO_THREADS={setting}"] if setting else [])])


def _collage_toolchain(precision: str) -> OpenVinoToolchain:
    spec = PRECISIONS[precision]
    return OpenVinoToolchain(
        spec.toolchain, spec.compiler, pattern_table=spec.compiler, combine=True, max_depth=4,
        requires=REQUIRED_MODULES, precision=precision,
        exact=None if precision == "f32" else PRECISIONS["f32"].toolchain, runs_onnx_file=precision == "f32",
        description=f"OpenVINO (CPU, {precision} inference precision), graph style",
    )


#: The Collage toolchains ``openvino`` and ``openvino-bf16``.
TOOLCHAIN_F32 = _collage_toolchain("f32")
TOOLCHAIN_BF16 = _collage_toolchain("bf16")


def _codegen(precision: str):
    def codegen(func: relay.Function) -> "tvm.runtime.Module":
        return compile_function(func, precision)

    return codegen


def hooks() -> List[registry.Hook]:
    """The codegens and packed functions of both precisions (always, so that a missing
    OpenVINO is a clear error) and their pattern tables (only when OpenVINO is installed)."""
    found: List[registry.Hook] = []
    for precision, spec in PRECISIONS.items():
        found += TOOLCHAINS[precision].hooks(spec.compiler, _codegen(precision), f"OpenVINO {precision}")
        if _installed():
            found.append(registry.pattern_table(
                spec.compiler, lambda precision=precision: pattern_table(precision),
                "ops that convert to ONNX and run in OpenVINO"))
    return found
