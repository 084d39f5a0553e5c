"""The ``tcutils_ort`` toolchain: ONNX Runtime as a BYOC compiler of Relay functions.

A partition marked ``Compiler="tcutils_ort"`` is converted to ONNX
(:mod:`.relay_to_onnx`) by the external codegen ``relay.ext.tcutils_ort``,
which returns a runtime module (:class:`.packed_call.PackedToolchain`) whose
function calls an onnxruntime ``InferenceSession`` (CPU provider, one per
model and process, full graph optimizations) on the executor's own buffers
through an ``IOBinding``: no tensor is copied on the way in or out. The model
is embedded in the module, so ``export_library`` and loading elsewhere work;
its large weights are not: they are lifted into the caller's parameters
(:func:`.packed_call.lift_constants`) and become the session's initializers
when it is created (:func:`.relay_to_onnx.externalize_inputs`).

Quantized models (a quantizer's QDQ file: ``qnn.quantize`` / ``qnn.dequantize``
around float ops) are claimed too: the converter writes ``QuantizeLinear`` /
``DequantizeLinear`` nodes, and a partition may take and return int8 / uint8
tensors, which are bound like float ones (the binding's element type is the
tensor's). onnxruntime fuses ``DequantizeLinear -> Conv -> QuantizeLinear``
and its kin into integer kernels (``QLinearConv``, ``QGemm``, ``QLinearAdd``,
``QLinearGlobalAveragePool``) when the session is created, so a partition
whose region starts and ends at 8-bit tensors runs integer arithmetic, as the
quantized file does in onnxruntime (see :mod:`.relay_to_onnx` for the numerics).

Settings (environment): ``TVM_TCUTILS_ORT_THREADS`` sets onnxruntime's
intra-op threads (default: as many as TVM's thread pool, see :func:`ort_threads`);
``TVM_TCUTILS_ORT_SPIN=1`` lets onnxruntime's threads spin between
runs (faster alone, but they then compete with TVM's threads in a mixed model).
"""
from __future__ import annotations

import hashlib
import importlib
import os
from typing import Dict, List, Tuple

import numpy as np

from ..._tvm import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import is_op, is_tuple, wildcard

from ... import registry
from . import relay_to_onnx
from .base import thread_budget
from .packed_call import (
    LIFTING_COMPILERS, PackedToolchain, activation_bytes, byoc_partition, function_of, kept, lifted_params,
    missing_modules,
    modules_present, tensor_data, tensor_view,
)

#: BYOC compiler name of this toolchain.
COMPILER = "tcutils_ort"

#: Python modules the toolchain needs.
REQUIRED_MODULES = ("onnxruntime", "onnx")

_MAX_BINDINGS = 8

#: Model metadata key: the names of the initializers a session is given at creation (lifted weights).
LIFTED_KEY = "tcutils.lifted"

#: Model metadata key: bytes of the tensors the model computes (:func:`.packed_call.activation_bytes`).
ACTIVATION_KEY = "tcutils.activation_bytes"

#: Models computing this many bytes or more run without onnxruntime's memory arena and memory pattern,
#: which keep a run's intermediate buffers allocated for the session's life; a large model then
#: allocates per run, which costs little next to its kernels (VGG-16's first two blocks at 224x224:
#: no difference in time or memory measured at batch 1, see docs/collage-search.md).
NO_ARENA_BYTES = 64 << 20

LIFTING_COMPILERS.add(COMPILER)

#: Operators whose operand is a tuple of tensors.
_TUPLE_INPUT = frozenset({"concatenate"})


def available() -> Tuple[bool, str]:
    """Whether onnxruntime and onnx can be used here, and why not.

    Returns
    -------
    (bool, str)
        ``(True, "onnxruntime <version>")`` or ``(False, reason)``.

    Examples
    --------
    >>> ok, reason = available()
    >>> isinstance(reason, str)
    True
    """
    if not _installed():
        return False, _missing_reason()
    try:
        ort = importlib.import_module("onnxruntime")
    except (ImportError, OSError, RuntimeError) as err:  # a broken install is as unusable as a missing one
        return False, f"onnxruntime does not import ({err}); install it with: pip install 'tvm-tcutils[ort]'"
    if "CPUExecutionProvider" not in ort.get_available_providers():
        return False, "onnxruntime has no CPUExecutionProvider"
    return True, f"onnxruntime {ort.__version__}"


def _installed() -> bool:
    """Cheap check (no import) that the required modules are present."""
    return modules_present(REQUIRED_MODULES)


def _missing_reason() -> str:
    missing = missing_modules(REQUIRED_MODULES)
    return f"{' and '.join(missing) or 'onnxruntime'} not installed; install with: pip install 'tvm-tcutils[ort]'"


def _require() -> None:
    ok, reason = available()
    if not ok:
        raise RuntimeError(f"toolchain {COMPILER} is unavailable: {reason}")


def pattern_table() -> List[tuple]:
    """One pattern per Relay operator the ONNX converter handles, with its predicate.

    Names are ``tcutils_ort.<op name>``; each predicate is
    :func:`relay_to_onnx.supported`, so a pattern claims exactly the calls
    that convert.

    Examples
    --------
    >>> names = [name for name, _, _ in pattern_table()]
    >>> "tcutils_ort.nn.conv2d" in names, "tcutils_ort.qnn.quantize" in names, "tcutils_ort.qnn.dequantize" in names
    (True, True, True)
    """
    table = []
    for op_name in sorted(relay_to_onnx.CONVERTERS):
        if op_name in _TUPLE_INPUT:
            # The tuple goes inside the composite: a tuple-typed composite parameter
            # would reach type inference as an incomplete type and fail.
            pattern = is_op(op_name)(is_tuple(None))
        else:
            arity = max(int(tvm.ir.Op.get(op_name).num_inputs), 1)
            pattern = is_op(op_name)(*[wildcard() for _ in range(arity)])
        table.append((f"{COMPILER}.{op_name}", pattern, relay_to_onnx.supported))
    return table


class _Session:
    """An inference session for one embedded model, with its I/O bindings by buffer address."""

    def __init__(self, payload: bytes, weights: List[np.ndarray] = ()):
        ort = importlib.import_module("onnxruntime")
        payload = resolve_payload(payload)
        metadata = _metadata(payload)
        options = _session_options(int(metadata.get(ACTIVATION_KEY, 0)))
        names = metadata[LIFTED_KEY].split(",") if metadata.get(LIFTED_KEY) else []
        if len(names) != len(weights):
            raise ValueError(f"the model has {len(names)} lifted weights, {len(weights)} were given")
        if names:
            # The arrays must outlive the session, which reads them in place.
            self.weights = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(kept(w))) for w in weights]
            options.add_external_initializers(names, self.weights)
        self.session = ort.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
        self.input_names = [arg.name for arg in self.session.get_inputs()]
        self.output_names = [arg.name for arg in self.session.get_outputs()]
        # The executor passes the lifted weights after the inputs; only the inputs are bound.
        self.num_inputs = len(self.input_names) + len(names)
        # Executors reuse their buffers, so a binding made once serves every later run.
        self.bindings: Dict[tuple, object] = {}

    def binding(self, inputs: List[int], outputs: List[int]):
        """The binding of these ``DLTensor`` addresses' buffers (made once per set of buffers)."""
        pointers = tuple(tensor_data(address) for address in inputs + outputs)
        found = self.bindings.get(pointers)
        if found is not None:
            return found
        binding = self.session.io_binding()
        for name, address, pointer in zip(self.input_names, inputs, pointers):
            view = tensor_view(address)  # checks the buffer is a compact CPU tensor
            binding.bind_input(name, "cpu", 0, view.dtype, list(view.shape), pointer)
        for name, address, pointer in zip(self.output_names, outputs, pointers[len(inputs):]):
            view = tensor_view(address)
            binding.bind_output(name, "cpu", 0, view.dtype, list(view.shape), pointer)
        if len(self.bindings) >= _MAX_BINDINGS:
            self.bindings.clear()
        self.bindings[pointers] = binding
        return binding


def ort_threads() -> int:
    """onnxruntime's intra-op threads: ``TVM_TCUTILS_ORT_THREADS``, else as many as TVM's pool has
    (:func:`~.base.thread_budget`).

    Examples
    --------
    >>> ort_threads() >= 1
    True
    """
    return thread_budget("TVM_TCUTILS_ORT_THREADS")


def _session_options(activation_bytes: int = 0):
    """onnxruntime's options for a model computing ``activation_bytes`` (its arena off from :data:`NO_ARENA_BYTES`).

    Examples
    --------
    >>> _session_options(0).enable_cpu_mem_arena, _session_options(NO_ARENA_BYTES).enable_cpu_mem_arena
    (True, False)
    """
    ort = importlib.import_module("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if activation_bytes >= NO_ARENA_BYTES:
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
    options.intra_op_num_threads = ort_threads()
    spin = "1" if os.environ.get("TVM_TCUTILS_ORT_SPIN", "0") == "1" else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    return options


def lifted_names(payload: bytes) -> List[str]:
    """Names of the lifted weights of an ONNX payload (its ``tcutils.lifted`` metadata), in parameter order.

    Examples
    --------
    >>> lifted_names(b"")
    []
    """
    value = _metadata(payload).get(LIFTED_KEY, "")
    return value.split(",") if value else []


def _metadata(payload: bytes) -> Dict[str, str]:
    onnx = importlib.import_module("onnx")
    model = onnx.ModelProto()
    # Only the metadata is wanted, but the proto is small: the lifted weights are not in it.
    model.ParseFromString(payload)
    return {prop.key: prop.value for prop in model.metadata_props}


def to_payload(func: relay.Function, externalize: bool = True) -> bytes:
    """The ONNX model of a partition as bytes, its lifted weights named in its metadata.

    With ``externalize`` they are initializers with external data
    (:func:`.relay_to_onnx.externalize_inputs`), else graph inputs.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(1, 8)), relay.var("tcutils_lifted_0", shape=(1, 8))
    >>> lifted_names(to_payload(relay.Function([x, w], x + w)))
    ['in1']
    """
    count = len(lifted_params(func))
    model = relay_to_onnx.to_onnx(func, name=str(func.attrs["global_symbol"]) if func.attrs else "tcutils")
    names = [f"in{i}" for i in range(len(func.params) - count, len(func.params))]
    if names:
        if externalize:
            relay_to_onnx.externalize_inputs(model, names)
        prop = model.metadata_props.add()
        prop.key, prop.value = LIFTED_KEY, ",".join(names)
    prop = model.metadata_props.add()
    prop.key, prop.value = ACTIVATION_KEY, str(activation_bytes(_typed(func)))
    return model.SerializeToString()


#: Attributes of a partition that runs the user's own ONNX file instead of an export of its body: the
#: file's absolute path, and its SHA-256 when Collage timed it (a changed file is an error, not a
#: silently different model).
FILE_ATTR, FILE_SHA_ATTR = "tcutils.onnx_file", "tcutils.onnx_sha256"

#: First line of a payload that names an ONNX file instead of holding a model.
_FILE_MAGIC = b"tcutils-onnx-file\n"


def file_payload(path: str, sha256: str) -> bytes:
    """A payload naming the ONNX file ``path`` with its expected SHA-256 (read when the partition first
    runs: a model of hundreds of megabytes is not copied into the module).

    Examples
    --------
    >>> file_payload("/models/m.onnx", "ab").splitlines()[1:]
    [b'/models/m.onnx', b'ab']
    """
    return _FILE_MAGIC + f"{path}\n{sha256}".encode()


def resolve_payload(payload: bytes) -> bytes:
    """The ONNX model bytes of ``payload``: itself, or the file it names (checked against its SHA-256).

    Examples
    --------
    >>> resolve_payload(b"model bytes")
    b'model bytes'
    >>> resolve_payload(file_payload("/no/such/model.onnx", "ab"))
    Traceback (most recent call last):
    ...
    FileNotFoundError: the partition runs the ONNX file /no/such/model.onnx, which is not there
    """
    if not payload.startswith(_FILE_MAGIC):
        return payload
    path, sha256 = payload[len(_FILE_MAGIC):].decode().rsplit("\n", 1)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the partition runs the ONNX file {path}, which is not there")
    with open(path, "rb") as fh:
        data = fh.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"the ONNX file {path} changed since Collage timed it (SHA-256 {sha256[:12]}...): "
                         "run Collage on it again")
    return data


def payload_of(func: relay.Function, externalize: bool = True) -> bytes:
    """What a partition runs: the user's ONNX file where the function names one (:data:`FILE_ATTR`,
    checked now against :data:`FILE_SHA_ATTR`), else the export of its body (:func:`to_payload`)."""
    attrs = func.attrs if func.attrs is not None else {}
    if FILE_ATTR not in attrs:
        return to_payload(func, externalize)
    path, sha256 = str(attrs[FILE_ATTR]), str(attrs[FILE_SHA_ATTR])
    resolve_payload(file_payload(path, sha256))  # fail at build time, not at the first run
    return file_payload(path, sha256)


def _typed(func: relay.Function) -> relay.Function:
    try:
        func.body.checked_type  # noqa: B018  (raises when untyped)
        return func
    except ValueError:
        return relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]


def _prepare(payload: bytes, weights: List[np.ndarray] = ()) -> _Session:
    _require()
    return _Session(payload, weights)


def _execute(state: _Session, inputs, outputs) -> None:
    state.session.run_with_iobinding(state.binding(inputs, outputs))


#: The packed functions ``tvm_tcutils.ort.run`` / ``tvm_tcutils.ort.load``.
TOOLCHAIN = PackedToolchain("ort", _prepare, _execute)


def compile_function(func: relay.Function) -> "tvm.runtime.Module":
    """External codegen ``relay.ext.tcutils_ort``: a Relay function to a runtime module.

    Parameters
    ----------
    func : relay.Function
        A partition (``Primitive=1``, ``Compiler="tcutils_ort"``,
        ``global_symbol``) of operators and composite functions that
        :func:`relay_to_onnx.supported` accepts.

    Returns
    -------
    tvm.runtime.Module
        A module exporting the function's ``global_symbol``.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 8))
    >>> f = relay.Function([x], relay.tanh(x)).with_attr("global_symbol", "ort_0")
    >>> mod = compile_function(f)
    >>> mod.get_function("ort_0") is not None
    True
    """
    _require()
    func = function_of(func)
    return TOOLCHAIN.build_module(func, payload_of(func))


def partition_for(mod: tvm.IRModule, params=None) -> tvm.IRModule:
    """Greedy BYOC partitioning: every maximal region of convertible operators goes to ``{COMPILER}``.

    ``mod`` is not modified; ``params`` are bound as constants first.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 8))
    >>> mod = tvm.IRModule.from_expr(relay.tanh(relay.nn.relu(x)))
    >>> [str(gv.name_hint) for gv in partition_for(mod).get_global_vars()]  # doctest: +SKIP
    ['main', 'tvmgen_default_tcutils_ort_main_0']
    """
    return byoc_partition(mod, COMPILER, params, merge=True)


def hooks() -> List[registry.Hook]:
    """The codegen and packed functions (always, so that a missing onnxruntime is a
    clear error) and the pattern table (only when onnxruntime is installed)."""
    found = TOOLCHAIN.hooks(COMPILER, compile_function, "ONNX Runtime")
    if _installed():
        found.append(registry.pattern_table(COMPILER, pattern_table, "ops that convert to ONNX"))
    return found
