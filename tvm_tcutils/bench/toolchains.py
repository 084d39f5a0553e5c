"""Benchmarks of Collage's toolchains: per-call cost, pool parking, per-operator-kind and whole-model latency.

Used by ``scripts/bench_packed_call.py``, ``bench_pool_parking.py`` and
``bench_collage_toolchains.py``.

Examples
--------
>>> mod = elementwise_chain(4)
>>> str(mod["main"].body.op.name)
'nn.relu'
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Optional

import numpy as np

from .._tvm import tvm
from tvm import relay

from .competitors import SampleTimer, relay_module


def elementwise_chain(ops: int) -> tvm.IRModule:
    """``ops`` small elementwise ops on a 1x256 tensor: (add a constant, relu) repeated.

    Each op is its own ``tcutils_ort`` partition in the packed-call benchmark.
    """
    x = relay.var("x", shape=(1, 256))
    y = x
    for _ in range(ops // 2):
        y = relay.nn.relu(relay.add(y, relay.const(np.full((1, 256), -0.01, "float32"))))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def with_run_function(function, build: Callable[[], SampleTimer]) -> SampleTimer:
    """``build()`` while ``function`` is the registered onnxruntime run function; the default is put back.

    Compiled code looks a packed function up at its first call and keeps it: a
    variant is built and warmed up (which ``build`` does) while its function is
    the registered one.
    """
    from .. import registry
    from ..collage.toolchains import ort

    with registry.overriding_func(ort.TOOLCHAIN.run_name, function):
        return build()


class BoundRun:
    """A toolchain session run from Python on arrays this object owns, through the session's I/O binding.

    The binding holds only the buffers' addresses: the arrays must live as long as
    it may run, so they live here, with it (a binding over arrays freed after it was
    made writes its output into whatever the allocator puts there next).

    Examples
    --------
    >>> run = BoundRun(ort_partition_state(), [np.ones((1, 256), "float32")])
    >>> run()
    >>> round(float(run.outputs[0].numpy()[0, 0]), 4)
    0.99
    """

    def __init__(self, state, inputs):
        from ..collage.toolchains.packed_call import _address

        self.state = state
        self.inputs = [tvm.nd.array(np.ascontiguousarray(x)) for x in inputs]
        session = state.session
        self.outputs = [tvm.nd.empty([int(d) for d in arg.shape], _ORT_DTYPES[arg.type])
                        for arg in session.get_outputs()]
        self.binding = state.binding([_address(t) for t in self.inputs], [_address(t) for t in self.outputs])

    def __call__(self) -> None:
        self.state.session.run_with_iobinding(self.binding)


#: onnxruntime's type names of the tensors :class:`BoundRun` allocates.
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int8)": "int8",
               "tensor(int32)": "int32", "tensor(int64)": "int64"}


def ort_partition_state():
    """The toolchain's session of one partition of :func:`elementwise_chain` (add a constant), made here.

    Examples
    --------
    >>> ort_partition_state().input_names
    ['in0']
    """
    from ..collage.toolchains import ort
    from ..collage.toolchains.packed_call import function_of

    x = relay.var("x", shape=(1, 256))
    func = relay.Function([x], relay.add(x, relay.const(np.full((1, 256), -0.01, "float32"))))
    func = function_of(func.with_attr("global_symbol", "tcutils_ort_alone"))
    return ort.TOOLCHAIN.prepare(ort.to_payload(func))


def ort_alone_timer(repeat: int = 3, min_ms: float = 20.0) -> SampleTimer:
    """One partition's onnxruntime session, run from Python through the same I/O binding, without TVM."""
    from .competitors import python_call

    return python_call(BoundRun(ort_partition_state(), [np.ones((1, 256), "float32")]), repeat=repeat,
                       min_ms=min_ms)


def packed_call_timers(ops: int, min_repeat_ms: int = 20) -> Dict[str, SampleTimer]:
    """Timers of a chain of ``ops`` ORT partitions with the C and the Python callback, and of TVM alone."""
    from unittest import mock

    from ..collage.toolchains import ort
    from ..collage.toolchains.packed_call import PACKED_CALL_VARIABLE, byoc_partition, native_module_maker

    mod = elementwise_chain(ops)
    parted = byoc_partition(mod, ort.COMPILER, merge=False)
    timers = {"TVM alone": relay_module(mod, repeat=1, min_repeat_ms=min_repeat_ms)}
    variants = [("Python callback", ort.TOOLCHAIN.run, "llvm"), ("C callback", ort.TOOLCHAIN.run_function(), "llvm")]
    if native_module_maker() is not None:
        # The native plugin's partition module (no compiled wrapper) calling the same C callback.
        variants.append(("native module", ort.TOOLCHAIN.run_function(), "native"))
    for label, function, kind in variants:
        with mock.patch.dict(os.environ, {PACKED_CALL_VARIABLE: kind}):  # the kind of partition module built
            timers[label] = with_run_function(
                function, lambda: relay_module(parted, repeat=1, min_repeat_ms=min_repeat_ms))
    return timers


_CHEAP = 0.05
#: Mixes by operator kind: per-op costs (ms) that make the search send the named kinds to ORT.
MIXES = {
    # Convolutions (with their bias/activation) on onnxruntime; pooling, concatenation... on TVM.
    "convs-on-ort": {
        "ort": {"nn.conv2d": 1.0, "add": _CHEAP, "nn.relu": _CHEAP, "nn.bias_add": _CHEAP, "multiply": _CHEAP,
                "*": 9.0},
        "tvm": {"nn.conv2d": 3.0, "*": _CHEAP},
    },
    # The per-op-kind split of the encoder: GELU's erf, softmax and batch_matmul on onnxruntime.
    "attention-on-ort": {
        "ort": {"erf": 0.1, "nn.softmax": 0.1, "nn.batch_matmul": 0.1, "*": 9.0},
        "tvm": {"erf": 1.0, "nn.softmax": 1.0, "nn.batch_matmul": 1.0, "*": _CHEAP},
    },
}


def mix(mod, params, rule: str):
    """The module partitioned by ``MIXES[rule]`` (tvm and ort), and its partition counts.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> _, counts = mix(*load_model("mlp"), "convs-on-ort")
    >>> sorted(counts)
    ['ort', 'tvm']
    """
    from .. import collage

    estimator = collage.MockCostEstimator(MIXES[rule], overhead={"ort": 0.2, "tvm": 0.2})
    result = collage.partition(mod, params, toolchains="tvm,ort", cost_estimator=estimator, validate_rounds=0)
    counts = {name: sum(p.toolchain == name for p in result.partitions) for name in ("tvm", "ort")}
    return result.mod, counts


def parking_timers(mod, params, mixed, repeat: int,
                   thresholds_us: Optional[Dict[str, float]]) -> Dict[str, SampleTimer]:
    """Timers of a mixed module unparked and parked at each ``{label: threshold_us}``, ORT greedy, TVM alone."""
    from .. import native
    from ..collage.driver import greedy_partition
    from ..collage.toolchains import ort
    from .._tvm import host_target

    def whole(m) -> SampleTimer:
        return relay_module(m, None, host_target(), repeat=repeat, warmup=3, min_repeat_ms=50)

    raw = ort.TOOLCHAIN.run_function(park=False)
    calls = {"no parking": raw}
    if thresholds_us:
        wrap = native.get("tvm_tcutils.native.park_pool")
        calls.update({label: wrap(raw, us) for label, us in thresholds_us.items()})
    timers = {label: with_run_function(function, lambda: whole(mixed)) for label, function in calls.items()}
    timers["ORT greedy"] = whole(greedy_partition(mod, params, "ort"))
    timers["TVM alone"] = whole(mod)
    return timers


# ---------------------------------------------------------------------------
# Per-operator-kind latency (scripts/bench_collage_toolchains.py)
# ---------------------------------------------------------------------------
SEQ, HIDDEN, HEADS = 128, 256, 4


class Kinds:
    """Small Relay functions, one per operator kind, at the shapes of the issue's models; seeded weights.

    Examples
    --------
    >>> params, body = Kinds().build("softmax")
    >>> [p.name_hint for p in params], sorted(Kinds.NAMES)[:2]
    (['x'], ['batch_matmul', 'conv'])
    """

    NAMES = ("dense", "dense_out", "batch_matmul", "softmax", "gelu_erf", "layernorm", "conv")
    HAS_BLAS = frozenset({"dense", "dense_out", "batch_matmul"})

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def weight(self, *shape):
        return relay.const((self.rng.standard_normal(shape) * np.sqrt(2.0 / shape[-1])).astype("float32"))

    def build(self, kind: str):
        """``(params, body)`` of one kind."""
        table = {
            "dense": lambda: self._dense(4 * HIDDEN, HIDDEN),
            "dense_out": lambda: self._dense(HIDDEN, 4 * HIDDEN),
            "batch_matmul": self._batch_matmul, "softmax": self._softmax, "gelu_erf": self._gelu,
            "layernorm": self._layer_norm, "conv": self._conv,
        }
        return table[kind]()

    def _dense(self, units, k):
        x = relay.var("x", shape=(SEQ, k))
        return [x], relay.nn.bias_add(relay.nn.dense(x, self.weight(units, k)), self.weight(units))

    def _batch_matmul(self):
        q = relay.var("q", shape=(HEADS, SEQ, HIDDEN // HEADS))
        k = relay.var("k", shape=(HEADS, SEQ, HIDDEN // HEADS))
        return [q, k], relay.nn.batch_matmul(q, k)

    def _softmax(self):
        x = relay.var("x", shape=(1, HEADS, SEQ, SEQ))
        return [x], relay.nn.softmax(x)

    def _gelu(self):
        x = relay.var("x", shape=(SEQ, 4 * HIDDEN))
        erf = relay.erf(relay.divide(x, relay.const(np.sqrt(2.0), "float32")))
        return [x], relay.multiply(relay.multiply(x, relay.add(erf, relay.const(1.0))), relay.const(0.5))

    def _layer_norm(self):
        # As TVM's ONNX importer writes LayerNormalization: mean, variance, sqrt, divide.
        x = relay.var("x", shape=(SEQ, HIDDEN))
        mean = relay.mean(x, axis=-1, keepdims=True)
        var = relay.variance(x, axis=-1, keepdims=True, with_mean=mean)
        norm = relay.divide(relay.subtract(x, mean), relay.sqrt(relay.add(var, relay.const(1e-12))))
        return [x], relay.add(relay.multiply(norm, self.weight(HIDDEN)), self.weight(HIDDEN))

    def _conv(self):
        x = relay.var("x", shape=(1, 64, 56, 56))
        y = relay.nn.conv2d(x, self.weight(64, 64, 3, 3), padding=(1, 1), channels=64, kernel_size=(3, 3))
        return [x], relay.nn.relu(relay.nn.bias_add(y, self.weight(64)))


def graph_timer(mod, inputs, params=None):
    """(a settled timer of ``mod`` built for this CPU, its first output)."""
    from ..measure import Timer
    from .competitors import settled

    timer = Timer(mod, params, repeat=5, warmup=1, inputs=inputs)
    return settled(timer.sample), timer.outputs()[0]


def ort_direct_timer(func=None, inputs=None, model=None) -> SampleTimer:
    """onnxruntime on the ONNX of ``func`` (or ``model``) from Python, with an IOBinding, settled."""
    import onnxruntime

    from ..collage.toolchains import relay_to_onnx
    from .competitors import onnx_session, settled

    if model is None:
        model = relay_to_onnx.to_onnx(relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"])
    options = onnxruntime.SessionOptions()
    # As the toolchain's sessions: idle threads sleep instead of spinning into the next variant's time.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    for arg, value in zip(session.get_inputs(), inputs.values()):
        binding.bind_cpu_input(arg.name, value)
    binding.bind_output(session.get_outputs()[0].name, "cpu")
    session.run_with_iobinding(binding)
    return settled(onnx_session(session, binding, repeat=5, min_ms=0.0))


#: The single toolchains next to TVM: column -> (Collage toolchain, precision for OpenVINO). Each is left
#: out, with a note, where it is not usable here (not installed, no bf16 on this CPU).
SINGLES = {"ort": ("ort", None), "blas": ("blas", None), "openvino": ("openvino", "f32"),
           "ov-bf16": ("openvino-bf16", "bf16")}

#: Largest error of a whole model's output against TVM's, relative to its norm, per column (bf16 rounds
#: the operands of every matmul and convolution, which adds up over layers).
WHOLE_MODEL_ERROR = {"ov-bf16": 5e-2}


def usable_singles(columns=tuple(SINGLES)):
    """``(usable columns, notes)``: the columns of :data:`SINGLES` usable here, and why each other is not.

    Examples
    --------
    >>> usable, notes = usable_singles(("blas",))
    >>> usable, notes
    (['blas'], [])
    """
    from .collage import usable_toolchains

    found, notes = usable_toolchains([SINGLES[column][0] for column in columns])
    names = {tc.name for tc in found}
    return [column for column in columns if SINGLES[column][0] in names], notes


def partitioned_for(column: str, mod, params=None):
    """``mod`` with every region the column's toolchain claims given to it (its ``partition_for``).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod = partitioned_for("blas", *load_model("mlp"))
    >>> sum("Compiler" in f.attrs for _, f in mod.functions.items() if f.attrs is not None)
    3
    """
    from ..collage.toolchains import blas, openvino, ort

    name, precision = SINGLES[column]
    if precision is not None:  # one OpenVINO module, one toolchain per precision
        return openvino.partition_for(mod, params, precision=precision)
    return {"ort": ort.partition_for, "blas": blas.partition_for}[name](mod, params)


def _check_kind(got, expected, column: str, kind: str) -> None:
    """A kind's output against TVM's: elementwise in f32; bf16 as a whole (``openvino.bf16_error``)."""
    from ..collage.toolchains import openvino

    if column != "ov-bf16":
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3, err_msg=f"{kind} on {column}")
        return
    error = openvino.bf16_error(got, expected)
    if not error <= openvino.BF16_RELATIVE_ERROR:
        raise AssertionError(f"{kind} on {column}: relative error {error:.2e} in bf16, "
                             f"more than {openvino.BF16_RELATIVE_ERROR:.0e}")


def kind_timers(kind: str, kinds: Kinds, columns) -> Dict[str, SampleTimer]:
    """Timers of one kind built each way (tvm, fastmath, each usable single of ``columns``, ort-direct); outputs
    checked against TVM."""
    from ..collage.toolchains import TVM_FASTMATH

    params, body = kinds.build(kind)
    func = relay.Function(params, body)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    inputs = {p.name_hint: kinds.rng.standard_normal([int(d) for d in p.type_annotation.shape]).astype("float32")
              for p in params}
    timers = {}
    timers["tvm"], expected = graph_timer(mod, inputs)
    timers["fastmath"], got = graph_timer(TVM_FASTMATH.rewrite(mod), inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    for column in columns:
        if column == "blas" and kind not in Kinds.HAS_BLAS:
            continue
        timers[column], got = graph_timer(partitioned_for(column, mod), inputs)
        _check_kind(got, expected, column, kind)
    if "ort" in columns:
        timers["direct"] = ort_direct_timer(func, inputs)
    return timers


def _close_enough(got, expected, column: str, name: str) -> None:
    error = float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-30))
    limit = WHOLE_MODEL_ERROR.get(column, 2e-3)
    if not error <= limit:
        raise AssertionError(f"{name} on {column}: output differs from TVM alone by {error:.2e} (relative), "
                             f"more than {limit:.0e}")


def model_timers(name: str, columns) -> tuple:
    """Timers of a whole model: TVM alone, with FastMath, the greedy BYOC partition of each usable single of
    ``columns`` (outputs checked against TVM alone), onnxruntime on its ONNX graph; partition counts."""
    from .. import models
    from ..collage.toolchains import TVM_FASTMATH

    mod, params = models.load_model(name)
    inputs = models.random_inputs(mod, params)
    timers, counts = {}, {}
    timers["tvm"], expected = graph_timer(mod, inputs, params)
    timers["fastmath"], _ = graph_timer(TVM_FASTMATH.rewrite(mod), inputs, params)
    for column in columns:
        parted = partitioned_for(column, mod, params)
        counts[column] = sum(1 for _, f in parted.functions.items() if f.attrs is not None and "Compiler" in f.attrs)
        timers[column], got = graph_timer(parted, inputs)
        _close_enough(got, expected, column, name)
    if "ort" in columns and name in models.ONNX_BUILDERS:
        timers["direct"] = ort_direct_timer(None, inputs, models.onnx_model(name))
    return timers, counts
