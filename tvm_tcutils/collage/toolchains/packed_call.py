"""Runtime modules that hand a Relay function's tensors to a Python toolchain.

A library-style toolchain (onnxruntime, numpy's BLAS) cannot be compiled into
TVM's generated code, so its external codegen emits a tiny TVM function named
after the partition's ``global_symbol`` whose body calls a packed function of
this package with the function's input and output tensors. The toolchain's
description of the work (an ONNX model, a BLAS call) is embedded in that
function as a string constant, so the module survives ``export_library`` and
loading in another process that imports :mod:`tvm_tcutils`:

.. code-block:: text

    if <toolchain>.run(key, in0, ..., out0, ...) != 0:      # unknown key
        <toolchain>.load(key, payload)                       # once per process
        <toolchain>.run(key, in0, ..., out0, ...)

Where the native plugin is built (``cmake/src/packed_call.cc``), the codegen
returns a ``tcutils_packed_call`` runtime module instead that makes the same
calls without compiling anything (:func:`native_module_maker`): the compiled
function costs 40-60 ms of lowering and LLVM per partition, and a greedy
partitioning of BERT-base has 373 of them. It is kept by ``export_library``
like the compiled one; loading such a library needs the plugin
(``TVM_TCUTILS_PACKED_CALL=llvm`` builds the compiled kind everywhere).

``run`` works on the executors' own buffers through zero-copy views
(:func:`tensor_view`, :func:`tensor_data`); ``load`` decodes the payload once
and caches what the toolchain builds from it (an inference session) per key.

Large weights stay out of the payload for the graph toolchains (ONNX Runtime,
OpenVINO): embedded, VGG-16's 0.4 GB ``fc6`` weight was held about eight times
while one module was built (ONNX proto, its serialised bytes, base64 text,
TIR string, LLVM IR, object code, loaded code, session), 3.6 GB in one process.
:func:`lift_constants` makes each large constant of such a partition a trailing
parameter (``tcutils_lifted_<n>``) that the caller passes; TVM then keeps it
once among the module's ordinary parameters, which ``export_library`` and
``save_model`` store as they store every weight, so a module stays
self-contained. The payload names those inputs, ``load`` receives them with
the payload and the toolchain makes them constants of its session (copied
once: sessions outlive executors), so it folds and pre-packs them as before.
The key of a payload covers a digest of the lifted weights
(``tcutils_lifted_digest``): partitions equal but for their weights get their
own sessions.

``run`` is called once per partition per inference, so its cost is paid at
every crossing between TVM and the toolchain. TVM's generic Python callback
turns each tensor argument into an ``NDArray`` object and the return value
into a TVM value through several Python layers: about 34 us a call here on top
of onnxruntime's own 7 us for a small partition. ``run`` is therefore
registered as a raw C callback that reads the ``DLTensor`` addresses straight
from TVM's argument array (about 15 us on top; ``scripts/bench_packed_call.py``),
where TVM's FFI is the ctypes one; elsewhere the plain Python function serves.

The toolchain's threads and TVM's pool workers compete for the same cores: the
workers spin between TVM operators (``TVM_THREAD_POOL_SPIN_COUNT``), also while
a toolchain runs. Where the native helpers are built, ``run`` is wrapped by
``tvm_tcutils.native.park_pool``, which puts the workers to sleep for the
duration of calls that took at least ``TVM_TCUTILS_PARK_MIN_US`` microseconds
last time (default 500; ``off`` turns parking off). See :func:`park_min_us`.
"""
from __future__ import annotations

import base64
import ctypes
import dataclasses
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..._tvm import tvm
from tvm import relay, te
from tvm._ffi.base import _LIB, check_call
from tvm._ffi.runtime_ctypes import ArgTypeCode, TVMArray

from ... import native, registry


#: DLPack device type of the CPU.
_KDL_CPU = 1
#: Offset of ``byte_offset`` in a ``DLTensor`` (data, device, ndim, dtype, shape, strides before it).
_BYTE_OFFSET = ctypes.sizeof(TVMArray) - ctypes.sizeof(ctypes.c_uint64)


#: Calls shorter than this (microseconds, their previous run) do not park TVM's pool: a wake-up costs more.
_PARK_MIN_US_DEFAULT = 500.0

#: Name prefix of a partition's parameters that stand for its lifted weights (:func:`lift_constants`).
LIFTED_PREFIX = "tcutils_lifted_"

#: Function attribute: digest of a partition's lifted weights, part of its payload key.
DIGEST_ATTR = "tcutils_lifted_digest"

#: Constants from this size (bytes) are lifted out of payloads; smaller ones cost less embedded.
LIFT_MIN_BYTES = 1 << 16

#: BYOC compilers whose codegen takes lifted weights (their toolchain modules add themselves).
LIFTING_COMPILERS: set = set()

#: Whether states may keep the executor's own buffers of lifted weights instead of copies (:func:`kept`):
#: only where no state outlives the executor that loaded it, as in a measuring worker, which drops
#: every state after each candidate (:func:`forget_sessions`). VGG-16's ``fc6``: 0.4 GB less.
BORROW_LIFTED = False


def kept(weight: np.ndarray) -> np.ndarray:
    """What a toolchain's state keeps of a lifted weight handed to ``prepare``: a copy, or the view
    itself where :data:`BORROW_LIFTED`.

    Examples
    --------
    >>> view = np.ones(3, "float32")
    >>> kept(view) is view, np.array_equal(kept(view), view)
    (False, True)
    """
    return weight if BORROW_LIFTED else np.array(weight, copy=True)


#: Every packed toolchain of the process (see :func:`forget_sessions`).
_TOOLCHAINS: List["weakref.ref"] = []


def forget_sessions() -> None:
    """Drop the loaded payloads of every packed toolchain (:meth:`PackedToolchain.forget`).

    A measuring worker calls it after a large candidate: the session of VGG-16's
    ``fc6`` holds 0.8 GB (the weight and its pre-packed copy).

    Examples
    --------
    >>> forget_sessions()
    """
    for ref in list(_TOOLCHAINS):
        toolchain = ref()
        if toolchain is not None:
            toolchain.forget()


def modules_present(names: Sequence[str]) -> bool:
    """Cheap check (no import) that the Python modules ``names`` are installed.

    Examples
    --------
    >>> modules_present(["json"]), modules_present(["no_such_module_here"])
    (True, False)
    """
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):  # ValueError: a module blocked in sys.modules
            return False
    return True


def missing_modules(names: Sequence[str]) -> List[str]:
    """The modules of ``names`` that do not import (missing, or a broken install).

    Examples
    --------
    >>> missing_modules(["json", "no_such_module_here"])
    ['no_such_module_here']
    """
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except (ImportError, OSError, RuntimeError):
            missing.append(name)
    return missing


def park_min_us() -> Optional[float]:
    """The shortest toolchain call (µs) that parks TVM's pool workers, or ``None`` for never.

    ``TVM_TCUTILS_PARK_MIN_US``: a number of microseconds, or ``off``; default 500
    (``scripts/bench_pool_parking.py --also-us`` compares thresholds). Read when the
    toolchains' packed functions are registered (importing the package).

    Examples
    --------
    >>> park_min_us() is None or park_min_us() >= 0
    True
    """
    value = os.environ.get("TVM_TCUTILS_PARK_MIN_US", "").strip()
    if not value:
        return _PARK_MIN_US_DEFAULT
    if value.lower() == "off":
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"TVM_TCUTILS_PARK_MIN_US must be a number of microseconds >= 0 or 'off', got {value!r}")
    return number


def _park_policy() -> Optional[tuple]:
    """(native wrapper, threshold in µs) when calls park TVM's pool, else ``None`` (turned off,
    or the native helpers are not built)."""
    threshold = park_min_us()
    wrap = native.get("tvm_tcutils.native.park_pool") if threshold is not None else None
    return None if wrap is None else (wrap, threshold)


def parking() -> str:
    """How toolchain calls treat TVM's pool, for cost-cache keys: ``park>=<us>`` or ``nopark``.

    Examples
    --------
    >>> parking().startswith(("park", "nopark"))
    True
    """
    policy = _park_policy()
    return "nopark" if policy is None else f"park>={policy[1]:g}"


def _parked(function: "tvm.runtime.PackedFunc") -> "tvm.runtime.PackedFunc":
    """``function`` behind the native pool-parking wrapper, where it is built and wanted."""
    policy = _park_policy()
    return function if policy is None else policy[0](function, policy[1])


def _address(array: "tvm.nd.NDArray") -> int:
    """Address of ``array``'s ``DLTensor``."""
    return ctypes.cast(array.handle, ctypes.c_void_p).value


def tensor_data(address: int) -> int:
    """Address of the first element of the ``DLTensor`` at ``address`` (a few hundred ns).

    Examples
    --------
    >>> a = tvm.nd.array(np.arange(4, dtype="float32"))
    >>> float(ctypes.c_float.from_address(tensor_data(_address(a)) + 4).value)
    1.0
    """
    return (ctypes.c_void_p.from_address(address).value or 0) + ctypes.c_uint64.from_address(
        address + _BYTE_OFFSET).value


def tensor_view(address: int) -> np.ndarray:
    """A numpy array sharing the memory of the ``DLTensor`` at ``address`` (a compact CPU tensor; no copy).

    Examples
    --------
    >>> a = tvm.nd.array(np.arange(6, dtype="int32").reshape(2, 3))
    >>> tensor_view(_address(a))[1].tolist()
    [3, 4, 5]
    """
    tensor = TVMArray.from_address(address)
    if tensor.device.device_type != _KDL_CPU:
        raise ValueError(f"tensor on device {tensor.device}; tvm_tcutils toolchains run on the CPU only")
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    if tensor.strides:
        expected = np.cumprod([1] + list(shape[::-1][:-1]))[::-1]
        if [int(tensor.strides[i]) for i in range(tensor.ndim)] != [int(x) for x in expected]:
            raise ValueError("tvm_tcutils toolchains need compact (row-major) tensors")
    dtype = np.dtype(str(tensor.dtype))
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype)
    buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(tensor_data(address))
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def signature(func: relay.Function):
    """``(input types, output types)`` of a typed Relay function; all static tensors.

    Examples
    --------
    >>> x = relay.var("x", shape=(2, 3))
    >>> f = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], x)))["main"]
    >>> [str(t) for t in signature(f)[1]]
    ['Tensor[(2, 3), float32]']
    """
    def tensors(ttype, what):
        types = list(ttype.fields) if isinstance(ttype, relay.TupleType) else [ttype]
        for item in types:
            if not isinstance(item, relay.TensorType) or not all(isinstance(d, tvm.tir.IntImm) for d in item.shape):
                raise ValueError(f"{what} has type {item}; external toolchains take statically shaped tensors")
        return types

    ins = [t for p in func.params for t in tensors(p.checked_type, f"parameter {p.name_hint}")]
    return ins, tensors(func.ret_type if func.ret_type is not None else func.body.checked_type, "the result")


#: ``int (*)(TVMValue* args, int* type_codes, int num_args, TVMRetValueHandle ret, void* resource)``;
#: every ``TVMValue`` this callback reads is 8 bytes (a pointer), so it reads them as int64.
_PACKED_CFUNC = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p,
    ctypes.c_void_p,
)
#: Type codes under which tensors reach a packed function: from compiled code, and from Python.
_TENSOR_CODES = (ArgTypeCode.DLTENSOR_HANDLE, ArgTypeCode.NDARRAY_HANDLE)


@dataclasses.dataclass
class PackedToolchain:
    """A toolchain reached from compiled code through two packed functions.

    Parameters
    ----------
    name : str
        Short name; the packed functions are ``tvm_tcutils.<name>.run`` and
        ``tvm_tcutils.<name>.load``.
    prepare : callable
        ``payload bytes -> state``: what to keep per payload (a session); the
        state has a ``num_inputs`` attribute (every tensor before the outputs,
        lifted weights included). A toolchain whose partitions have lifted
        weights (:func:`lift_constants`) is called ``prepare(payload, weights)``
        with NumPy views of the executor's buffers, in parameter order: the
        state outlives that executor, so it keeps copies (:func:`kept`).
    execute : callable
        ``(state, inputs, outputs)`` with lists of ``DLTensor`` addresses
        (ints; read them with :func:`tensor_data` / :func:`tensor_view`):
        compute the outputs in place. It must not run TVM-compiled code that
        uses TVM's thread pool: during long calls the pool's workers are parked
        (:func:`park_min_us`) until it returns.
    """

    name: str
    prepare: Callable[[bytes], Any]
    execute: Callable[[Any, List[int], List[int]], None]

    def __post_init__(self):
        _TOOLCHAINS.append(weakref.ref(self))  # dataclasses compare by value: no WeakSet
        self._states: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._callback = None  # (C thunk, PackedFunc, parked PackedFunc): see ``_make_callback``

    @property
    def run_name(self) -> str:
        return f"tvm_tcutils.{self.name}.run"

    @property
    def load_name(self) -> str:
        return f"tvm_tcutils.{self.name}.load"

    def run(self, key: str, *tensors: "tvm.nd.NDArray") -> int:
        """Packed function body: compute, or return 1 when ``key`` is not loaded yet."""
        return self._run(key, [_address(t) for t in tensors])

    def _run(self, key: str, tensors: List[int]) -> int:
        state = self._states.get(key)
        if state is None:
            return 1
        count = state.num_inputs
        if len(tensors) < count:
            raise ValueError(f"{self.run_name}: {len(tensors)} tensors for a payload with {count} inputs")
        self.execute(state, tensors[:count], tensors[count:])
        return 0

    def run_function(self, park: bool = True) -> Callable:
        """``run`` as TVM should register it: a raw C callback when TVM's FFI is ctypes, else :meth:`run`;
        with ``park``, behind the pool-parking wrapper where the native helpers are built
        (:func:`park_min_us`).

        Examples
        --------
        >>> from tvm_tcutils.collage.toolchains.blas import TOOLCHAIN
        >>> isinstance(TOOLCHAIN.run_function(), tvm.runtime.PackedFunc) or TOOLCHAIN.run_function() == TOOLCHAIN.run
        True
        """
        if self._callback is None:
            self._callback = self._make_callback()
        _, function, parked = self._callback
        return parked if park else function

    def _make_callback(self) -> tuple:
        """(C thunk or None, PackedFunc of ``run``, that function behind the parking wrapper)."""
        try:
            from tvm._ffi._ctypes.packed_func import _make_packed_func
        except ImportError:  # TVM's Cython FFI: the Python function is the way in
            function = tvm.runtime.convert(self.run)
            return None, function, _parked(function)
        callback = _PACKED_CFUNC(self._c_run)
        # Compiled modules keep the function they looked up, also after a re-registration
        # (``importlib.reload``): the C thunk must outlive this toolchain object, so the
        # process keeps every one (on ``tvm``, which reloading this package does not renew).
        tvm.__dict__.setdefault("_tvm_tcutils_callbacks", []).append(callback)
        handle = ctypes.c_void_p()
        check_call(_LIB.TVMFuncCreateFromCFunc(callback, None, None, ctypes.byref(handle)))
        function = _make_packed_func(handle, False)
        return callback, function, _parked(function)

    def _c_run(self, args, codes, num_args, ret, _resource) -> int:
        """The C callback: ``run(key, tensor, ...)`` decoded from TVM's argument array."""
        try:
            if num_args < 1 or codes[0] != ArgTypeCode.STR:
                raise TypeError(f"{self.run_name}: the first argument must be the payload key (a string)")
            tensors = []
            for i in range(1, num_args):
                if codes[i] not in _TENSOR_CODES:
                    raise TypeError(f"{self.run_name}: argument {i} must be a tensor, got TVM type code {codes[i]}")
                tensors.append(args[i])
            status = self._run(ctypes.string_at(args[0]).decode(), tensors)
        except Exception as err:  # noqa: BLE001  (handed to TVM as its own callbacks do; re-raised at the caller)
            _LIB.TVMAPISetLastPythonError(ctypes.py_object(err))
            return -1
        value, code = ctypes.c_int64(status), ctypes.c_int(ArgTypeCode.INT)
        return _LIB.TVMCFuncSetReturn(ctypes.c_void_p(ret), ctypes.byref(value), ctypes.byref(code), 1)

    def load(self, key: str, payload: str, *lifted: "tvm.nd.NDArray") -> int:
        """Packed function body: build the state of an embedded payload once per process.

        ``lifted``: the partition's lifted weights (:func:`lift_constants`), handed
        to ``prepare`` as views of the executor's buffers (see :data:`BORROW_LIFTED`).
        """
        with self._lock:
            if key not in self._states:
                data = base64.b64decode(payload)
                if lifted:
                    self._states[key] = self.prepare(data, [tensor_view(_address(t)) for t in lifted])
                else:
                    self._states[key] = self.prepare(data)
        return 0

    def cached(self) -> int:
        """How many payloads this process has loaded."""
        return len(self._states)

    def forget(self) -> None:
        """Drop every loaded payload's state (sessions); a later call loads it again.

        Only when no module built from them runs: a measuring worker calls it
        between candidates (:func:`forget_sessions`).
        """
        with self._lock:
            self._states.clear()

    def build_module(self, func: relay.Function, payload: bytes) -> "tvm.runtime.Module":
        """A runtime module exporting ``func``'s ``global_symbol`` that runs ``payload``.

        Examples
        --------
        >>> from tvm_tcutils.collage.toolchains.blas import TOOLCHAIN, _plan
        >>> a, b = relay.var("a", shape=(2, 3)), relay.var("b", shape=(4, 3))
        >>> f = function_of(relay.Function([a, b], relay.nn.dense(a, b)).with_attr("global_symbol", "mm"))
        >>> module = TOOLCHAIN.build_module(f, _plan(f).to_bytes())
        >>> out = tvm.nd.empty((2, 4))
        >>> module["mm"](tvm.nd.array(np.ones((2, 3), "float32")), tvm.nd.array(np.ones((4, 3), "float32")), out)
        >>> out.numpy()[0]
        array([3., 3., 3., 3.], dtype=float32)
        """
        symbol = str(func.attrs["global_symbol"])
        in_types, out_types = signature(func)
        lifted = len(lifted_params(func))
        digest = str(func.attrs[DIGEST_ATTR]).encode() if lifted else b""
        key = f"{self.name}-{hashlib.sha256(payload + digest).hexdigest()[:24]}"
        text = base64.b64encode(payload).decode("ascii")
        native_module = native_module_maker()
        if native_module is not None:
            return native_module(symbol, self.run_name, self.load_name, key, text, len(in_types), lifted)
        inputs = [te.placeholder(_dims(t), str(t.dtype), name=f"in{i}") for i, t in enumerate(in_types)]

        def body(ins, outs):
            builder = tvm.tir.ir_builder.create()
            call = tvm.tir.call_packed(self.run_name, key, *ins, *outs)
            with builder.if_scope(call != 0):
                builder.emit(tvm.tir.call_packed(self.load_name, key, text, *ins[len(ins) - lifted:]))
                builder.emit(tvm.tir.call_packed(self.run_name, key, *ins, *outs))
            return builder.get()

        outputs = te.extern(
            [_dims(t) for t in out_types], inputs, body,
            dtype=[str(t.dtype) for t in out_types], name=f"{self.name}_call",
        )
        outputs = outputs if isinstance(outputs, list) else [outputs]
        schedule = te.create_schedule([out.op for out in outputs])
        return tvm.build(schedule, inputs + outputs, target="llvm", name=symbol)

    def hooks(self, compiler: str, codegen: Callable, description: str) -> List[registry.Hook]:
        """The packed functions to register for BYOC compiler ``compiler``.

        Besides ``run``/``load`` and the codegen ``relay.ext.<compiler>``, a
        ``relay.ext.<compiler>.constant_updater`` that reports no constants:
        they are in the payload, and TVM's default updater would store every
        one of them a second time in the built module's parameters.
        """
        return [
            registry.packed_func(self.run_name, self.run_function(), f"{description}: run"),
            registry.packed_func(self.load_name, self.load, f"{description}: load an embedded payload"),
            registry.packed_func(f"relay.ext.{compiler}", codegen, f"external codegen: Relay -> {description}"),
            registry.packed_func(
                f"relay.ext.{compiler}.constant_updater", _no_constants, "constants live in the embedded payload"
            ),
        ]


#: ``TVM_TCUTILS_PACKED_CALL=llvm``: partitions get the compiled wrapper even where the native plugin is built
#: (a library exported for a machine whose tvm-tcutils has no native plugin to load the other kind).
PACKED_CALL_VARIABLE = "TVM_TCUTILS_PACKED_CALL"
#: The global function TVM calls to load a native partition module from a library (the plugin registers it).
NATIVE_LOADER = "runtime.module.loadbinary_tcutils_packed_call"


def native_module_maker() -> Optional[Callable]:
    """The native plugin's maker of a partition's runtime module (``tcutils_packed_call``), or None where
    the plugin is not built (or :data:`PACKED_CALL_VARIABLE` asks for ``llvm``): then each partition is a
    small TIR function compiled with LLVM (40-60 ms a partition; the native module takes microseconds).

    The native module makes the same calls as the compiled one (``run``, then ``load`` and ``run`` again for
    an unknown key) and is kept by ``export_library``; loading such a library needs the plugin.

    Examples
    --------
    >>> maker = native_module_maker()
    >>> maker is None or callable(maker)
    True
    """
    choice = os.environ.get(PACKED_CALL_VARIABLE, "native").strip().lower()
    if choice not in ("native", "llvm"):
        raise ValueError(f"{PACKED_CALL_VARIABLE}={choice!r}: choose 'native' (default) or 'llvm'")
    return native.get("tvm_tcutils.native.packed_call_module") if choice == "native" else None


def _no_constants(func, symbol) -> dict:
    """Constant updater of the packed toolchains: nothing for TVM to keep."""
    return {}


def _dims(ttype) -> List[int]:
    return [int(d) for d in ttype.shape]


def function_of(expr: relay.Expr) -> relay.Function:
    """``expr`` as a typed function, checked to be an external-codegen function.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> f = relay.Function([x], x).with_attr("global_symbol", "f")
    >>> function_of(f).attrs["global_symbol"]
    'f'
    """
    if not isinstance(expr, relay.Function):
        raise TypeError(f"an external codegen takes a relay.Function, got {type(expr).__name__}")
    if expr.attrs is None or "global_symbol" not in expr.attrs:
        raise ValueError("the function has no global_symbol attribute (PartitionGraph sets it)")
    try:
        expr.body.checked_type  # noqa: B018  (raises when untyped)
        return expr
    except ValueError:
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(expr))
        return list(mod.functions.values())[0]


def lifted_params(func: relay.Function) -> List[relay.Var]:
    """The trailing parameters of ``func`` that stand for lifted weights (:func:`lift_constants`).

    Examples
    --------
    >>> x, w = relay.var("x", shape=(2,)), relay.var(LIFTED_PREFIX + "0", shape=(2,))
    >>> [v.name_hint for v in lifted_params(relay.Function([x, w], x + w))]
    ['tcutils_lifted_0']
    """
    params = list(func.params)
    count = 0
    while count < len(params) and params[len(params) - 1 - count].name_hint.startswith(LIFTED_PREFIX):
        count += 1
    if any(p.name_hint.startswith(LIFTED_PREFIX) for p in params[:len(params) - count]):
        raise ValueError(f"lifted weights ({LIFTED_PREFIX}*) must be the last parameters of a partition")
    return params[len(params) - count:]


def type_bytes(ttype) -> int:
    """Bytes of the tensors of a Relay type (a tensor type or a tuple of them); 0 for dynamic shapes.

    Examples
    --------
    >>> type_bytes(relay.TensorType((2, 3), "float32")), type_bytes(relay.TupleType([relay.TensorType((4,), "int8")]))
    (24, 4)
    """
    if isinstance(ttype, relay.TupleType):
        return sum(type_bytes(field) for field in ttype.fields)
    if not isinstance(ttype, relay.TensorType) or not all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape):
        return 0
    return int(np.prod(_dims(ttype), dtype=np.int64)) * ((tvm.DataType(ttype.dtype).bits + 7) // 8)


def activation_bytes(func: relay.Function) -> int:
    """Bytes of the tensors a typed function computes: the outputs of its operator calls, nested functions included.

    What executing it holds beyond its weights, about: a toolchain's intermediate
    buffers and workspaces grow with it, not with the weights (see
    :func:`tvm_tcutils.collage.cost.workers.heavy_turn`).

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 256))
    >>> f = relay.Function([x], relay.nn.relu(relay.exp(x)))
    >>> activation_bytes(relay.transform.InferType()(tvm.IRModule.from_expr(f))["main"])
    2048
    """
    found = [0]

    def visit(expr) -> None:
        # Calls of functions (composites, partitions) return what their last operator made: counted once.
        if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
            found[0] += type_bytes(expr.checked_type)

    relay.analysis.post_order_visit(func, visit)
    return found[0]


class _Lift(relay.ExprMutator):
    """Replaces the large constants of one partition's body by new parameters (one per distinct array)."""

    def __init__(self, min_bytes: int):
        super().__init__()
        self.min_bytes = min_bytes
        self.lifted: Dict[int, tuple] = {}  # tensor address -> (constant, its parameter)

    def visit_function(self, fn):
        # Nested functions are composites: their constants are theirs (and rarely large).
        return fn

    def visit_constant(self, const):
        array = const.data
        try:
            np.dtype(array.dtype)
        except TypeError:  # bfloat16 and custom types: no NumPy view to hand the toolchain
            return const
        size = int(np.prod([int(d) for d in array.shape], dtype=np.int64)) * tvm.DataType(array.dtype).bits // 8
        if size < self.min_bytes:
            return const
        address = _address(array)
        if address not in self.lifted:
            var = relay.var(f"{LIFTED_PREFIX}{len(self.lifted)}", relay.TensorType(array.shape, array.dtype))
            self.lifted[address] = (const, var)
        return self.lifted[address][1]


class _PassLifted(relay.ExprMutator):
    """Appends the lifted weights to every call of the partitions that lost them."""

    def __init__(self, extra: Dict[str, tuple]):
        super().__init__()
        self.extra = extra  # name -> (new global var, constants)

    def visit_call(self, call):
        new = super().visit_call(call)
        if isinstance(call.op, relay.GlobalVar) and call.op.name_hint in self.extra:
            # A new global var: the old one carries the type inferred before, with fewer parameters.
            gvar, constants = self.extra[call.op.name_hint]
            return relay.Call(gvar, list(new.args) + constants, new.attrs, new.type_args, new.span)
        return new


def _digest(constants: Sequence[relay.Constant]) -> str:
    """Content digest of ``constants`` (read in place, not copied)."""
    digest = hashlib.blake2b(digest_size=16)
    for const in constants:
        view = tensor_view(_address(const.data))
        digest.update(f"{view.dtype}{view.shape}".encode())
        digest.update(view.reshape(-1).view(np.uint8) if view.size else b"")
    return digest.hexdigest()


def lift_constants(mod: tvm.IRModule, compilers: Optional[Sequence[str]] = None,
                   min_bytes: int = LIFT_MIN_BYTES) -> tvm.IRModule:
    """``mod`` with the large constants of its packed-toolchain partitions passed in by their callers.

    Each constant of at least ``min_bytes`` in the body of a partition of
    ``compilers`` (default :data:`LIFTING_COMPILERS`; constants inside its
    composite functions stay) becomes a trailing parameter ``tcutils_lifted_<n>``
    and every call of the partition passes the constant: TVM then stores it once
    with the module's other weights, and the toolchain's payload leaves it out
    (see the module's docstring). Partitions already lifted, and every other
    function, are unchanged; ``mod`` is not modified.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(4, 64)), relay.const(np.ones((64, 64), "float32"))
    >>> f = relay.Function([x], relay.nn.dense(x, w), relay.TensorType((4, 64))).with_attr("Compiler", "c")
    >>> mod = tvm.IRModule()
    >>> mod[relay.GlobalVar("p")] = f
    >>> y = relay.var("y", shape=(4, 64))
    >>> mod["main"] = relay.Function([y], mod.get_global_var("p")(y))
    >>> lifted = lift_constants(mod, ["c"], min_bytes=1024)
    >>> [p.name_hint for p in lifted["p"].params], type(lifted["main"].body.args[1]).__name__
    (['x', 'tcutils_lifted_0'], 'Constant')
    """
    wanted = set(LIFTING_COMPILERS if compilers is None else compilers)
    functions, extra = {}, {}
    for gv, func in mod.functions.items():
        if (isinstance(func, relay.Function) and func.attrs is not None and "Compiler" in func.attrs
                and str(func.attrs["Compiler"]) in wanted and not lifted_params(func)):
            lift = _Lift(min_bytes)
            body = lift.visit(func.body)
            if lift.lifted:
                constants, new_params = zip(*lift.lifted.values())
                lifted = relay.Function(list(func.params) + list(new_params), body, func.ret_type,
                                        func.type_params, func.attrs)
                gvar = relay.GlobalVar(gv.name_hint)
                functions[gv] = (gvar, lifted.with_attr(DIGEST_ATTR, _digest(constants)))
                extra[gv.name_hint] = (gvar, list(constants))
    if not extra:
        return mod
    limit = sys.getrecursionlimit()
    # ExprMutator recurses once per nested expression: whole models are deeper than the default limit.
    sys.setrecursionlimit(max(limit, 100_000))
    try:
        caller = _PassLifted(extra)
        for gv, func in mod.functions.items():
            if gv not in functions and isinstance(func, relay.Function):
                visited = caller.visit(func)
                if not visited.same_as(func):
                    functions[gv] = (gv, visited)
    finally:
        sys.setrecursionlimit(limit)
    out = tvm.IRModule(dict(functions.get(gv, (gv, func)) for gv, func in mod.functions.items()),
                       type_definitions=mod.type_definitions, attrs=mod.attrs)
    return relay.transform.InferType()(out)


def byoc_partition(mod: tvm.IRModule, compiler: str, params=None, merge: bool = True) -> tvm.IRModule:
    """Greedy BYOC partitioning for ``compiler`` (the baseline Collage improves on).

    Binds ``params``, merges the compiler's registered pattern table into
    composite functions, and gives every maximal region of them to the
    compiler (``AnnotateTarget``, ``MergeCompilerRegions``, ``PartitionGraph``).
    With ``merge=False`` every composite function is its own partition (for
    library-style toolchains). ``mod`` is not modified.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(4, 8)), relay.const(np.ones((16, 8), "float32"))
    >>> mod = tvm.IRModule.from_expr(relay.nn.relu(relay.nn.dense(x, w)))
    >>> parted = byoc_partition(mod, "tcutils_blas", merge=False)
    >>> sorted(str(gv.name_hint) for gv in parted.get_global_vars())
    ['main', 'tvmgen_default_tcutils_blas_main_0']
    """
    table = relay.op.contrib.get_pattern_table(compiler)
    if table is None:
        raise ValueError(f"no pattern table registered for compiler {compiler!r}")
    if params:
        mod = tvm.IRModule.from_expr(relay.build_module.bind_params_by_name(mod["main"], params))
    passes = [
        relay.transform.InferType(),
        relay.transform.MergeComposite(table),
        relay.transform.AnnotateTarget([compiler]),
        *([relay.transform.MergeCompilerRegions()] if merge else []),
        relay.transform.PartitionGraph(),
        relay.transform.InferType(),
    ]
    with tvm.transform.PassContext(opt_level=3):
        parted = tvm.transform.Sequential(passes)(mod)
    return lift_constants(parted, [compiler]) if compiler in LIFTING_COMPILERS else parted
