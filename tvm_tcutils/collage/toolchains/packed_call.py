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

``run`` works on the executors' own buffers through zero-copy views
(:func:`array_view`, :func:`data_pointer`); ``load`` decodes the payload once
and caches what the toolchain builds from it (an inference session) per key.
"""
from __future__ import annotations

import base64
import ctypes
import dataclasses
import hashlib
import threading
from typing import Any, Callable, Dict, List

import numpy as np

from ..._tvm import tvm
from tvm import relay, te

from ... import registry


def data_pointer(array: "tvm.nd.NDArray") -> int:
    """Address of the first element of ``array`` (a compact CPU tensor).

    Examples
    --------
    >>> a = tvm.nd.array(np.zeros(4, "float32"))
    >>> data_pointer(a) != 0
    True
    """
    handle = array.handle.contents
    return int(handle.data or 0) + int(handle.byte_offset)


def array_view(array: "tvm.nd.NDArray") -> np.ndarray:
    """A numpy array sharing ``array``'s memory (no copy).

    Examples
    --------
    >>> a = tvm.nd.array(np.zeros((2, 2), "float32"))
    >>> array_view(a)[0, 1] = 5.0
    >>> float(a.numpy()[0, 1])
    5.0
    """
    _require_compact(array)
    dtype = np.dtype(str(array.dtype))
    shape = tuple(int(d) for d in array.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype)
    buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(data_pointer(array))
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _require_compact(array: "tvm.nd.NDArray") -> None:
    handle = array.handle.contents
    if handle.device.device_type != tvm.cpu().device_type:
        raise ValueError(f"tensor on device {array.device}; tvm_tcutils toolchains run on the CPU only")
    if handle.strides:
        shape = [int(d) for d in array.shape]
        expected = np.cumprod([1] + shape[::-1][:-1])[::-1]
        if [int(handle.strides[i]) for i in range(len(shape))] != [int(s) for s in expected]:
            raise ValueError("tvm_tcutils toolchains need compact (row-major) tensors")


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
        state has a ``num_inputs`` attribute.
    execute : callable
        ``(state, inputs, outputs)`` with lists of ``tvm.nd.NDArray``: compute
        the outputs in place.
    """

    name: str
    prepare: Callable[[bytes], Any]
    execute: Callable[[Any, List["tvm.nd.NDArray"], List["tvm.nd.NDArray"]], None]

    def __post_init__(self):
        self._states: Dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def run_name(self) -> str:
        return f"tvm_tcutils.{self.name}.run"

    @property
    def load_name(self) -> str:
        return f"tvm_tcutils.{self.name}.load"

    def run(self, key: str, *tensors) -> int:
        """Packed function body: compute, or return 1 when ``key`` is not loaded yet."""
        state = self._states.get(key)
        if state is None:
            return 1
        count = state.num_inputs
        self.execute(state, list(tensors[:count]), list(tensors[count:]))
        return 0

    def load(self, key: str, payload: str) -> int:
        """Packed function body: build the state of an embedded payload once per process."""
        with self._lock:
            if key not in self._states:
                self._states[key] = self.prepare(base64.b64decode(payload))
        return 0

    def cached(self) -> int:
        """How many payloads this process has loaded."""
        return len(self._states)

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
        key = f"{self.name}-{hashlib.sha256(payload).hexdigest()[:24]}"
        text = base64.b64encode(payload).decode("ascii")
        inputs = [te.placeholder(_dims(t), str(t.dtype), name=f"in{i}") for i, t in enumerate(in_types)]

        def body(ins, outs):
            builder = tvm.tir.ir_builder.create()
            call = tvm.tir.call_packed(self.run_name, key, *ins, *outs)
            with builder.if_scope(call != 0):
                builder.emit(tvm.tir.call_packed(self.load_name, key, text))
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
            registry.packed_func(self.run_name, self.run, f"{description}: run"),
            registry.packed_func(self.load_name, self.load, f"{description}: load an embedded payload"),
            registry.packed_func(f"relay.ext.{compiler}", codegen, f"external codegen: Relay -> {description}"),
            registry.packed_func(
                f"relay.ext.{compiler}.constant_updater", _no_constants, "constants live in the embedded payload"
            ),
        ]


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
        return tvm.transform.Sequential(passes)(mod)
