"""Model loading shared by the API, the CLI, the demo, tests and benchmarks.

A model is named by one string:

* a name from TVM's own model zoo (``relay.testing``), e.g. ``resnet-50``,
  ``mobilenet``, ``squeezenet1.1``, ``inception_v3`` (see :data:`ZOO`);
* a path to an ONNX file (``.onnx``), imported with ``relay.frontend.from_onnx``;
* a path to a saved Relay module: JSON (``.json``, from :func:`save_model`)
  or text (``.relay`` / ``.txt``), with its parameters in a sibling
  ``.params`` file when there is one.

Every failure is a :class:`ModelError` with one line saying what was wrong.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile  # noqa: F401  (the examples use it)
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ._tvm import tvm
from tvm import relay

from .files import can_create_in, write_atomically
from .onnx_writer import OnnxGraph

Params = Dict[str, "tvm.nd.NDArray"]


class ModelError(ValueError):
    """A model could not be loaded or saved; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """An entry of the built-in model zoo."""

    name: str
    build: Callable[[int, str], Tuple[tvm.IRModule, Params]]
    input_shape: Tuple[int, ...]
    description: str


def _zoo(module: str, **kwargs) -> Callable[[int, str], Tuple[tvm.IRModule, Params]]:
    """A builder calling ``relay.testing.<module>.get_workload`` with fixed keyword arguments."""

    def build(batch: int, dtype: str):
        import importlib

        testing = importlib.import_module(f"tvm.relay.testing.{module}")
        return testing.get_workload(batch_size=batch, dtype=dtype, **kwargs)

    return build


_IMAGE = (3, 224, 224)
#: The built-in models, by name.
ZOO: Dict[str, ZooModel] = {
    m.name: m
    for m in [
        *(ZooModel(f"resnet-{n}", _zoo("resnet", num_layers=n), _IMAGE, f"ResNet-{n} v1")
          for n in (18, 34, 50, 101, 152)),
        ZooModel("mobilenet", _zoo("mobilenet"), _IMAGE, "MobileNet v1"),
        *(ZooModel(f"squeezenet{v}", _zoo("squeezenet", version=v), _IMAGE, f"SqueezeNet {v}")
          for v in ("1.0", "1.1")),
        ZooModel("inception_v3", _zoo("inception_v3"), (3, 299, 299), "Inception v3"),
        *(ZooModel(f"vgg-{n}", _zoo("vgg", num_layers=n), _IMAGE, f"VGG-{n}") for n in (11, 16)),
        ZooModel("densenet-121", _zoo("densenet", densenet_size=121), _IMAGE, "DenseNet-121"),
        ZooModel("mlp", _zoo("mlp"), (1, 28, 28), "3-layer MLP on 28x28 images"),
    ]
}
_ALIASES = {"squeezenet": "squeezenet1.0", "inception-v3": "inception_v3", "resnet": "resnet-18"}

_WEIGHTS = ("he", "zoo")


def realistic_params(params: Params, seed: int = 0) -> Params:
    """Re-draw zoo parameters so that activations keep a realistic scale.

    ``relay.testing``'s initializer shrinks activations layer after layer into
    denormal floats, which slows every backend 1.7-5x and makes timings noisy.
    Weights are drawn He-style (normal, std ``sqrt(2 / fan_in)``), batch-norm
    statistics are the identity and biases are zero.

    Parameters
    ----------
    params : dict of str to NDArray
        Parameters as returned by a ``relay.testing`` workload; not modified.
    seed : int
        Seed of the generator, so that runs are repeatable.

    Returns
    -------
    dict of str to NDArray
        New parameters with the same names, shapes and dtypes.

    Examples
    --------
    >>> mod, params = load_model("mlp", weights="zoo")
    >>> new = realistic_params(params)
    >>> sorted(new) == sorted(params)
    True
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(params):
        value = params[name]
        shape, dtype = tuple(int(d) for d in value.shape), np.dtype(value.dtype)
        if name.endswith(("_gamma", "_moving_var")):
            new = np.ones(shape)
        elif name.endswith(("_beta", "_moving_mean", "_bias")):
            new = np.zeros(shape)
        elif len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            new = _normal(rng, np.sqrt(2.0 / fan_in), shape, dtype)
        else:
            new = value.numpy()
        out[name] = tvm.nd.array(np.asarray(new, dtype=dtype))
    return out


def _normal(rng: np.random.Generator, std: float, shape: Tuple[int, ...], dtype: np.dtype,
            block: int = 1 << 21) -> np.ndarray:
    """``rng.normal(0, std, shape)`` in ``dtype``, drawn in blocks of rows of about ``block`` numbers: the
    same numbers (the generator's stream is sequential) without a float64 copy of the whole tensor
    (0.8 GB for VGG-16's ``fc6``, which made loading the model peak at 2.7 GB instead of 1.6 GB).

    >>> a = _normal(np.random.default_rng(0), 0.5, (5, 3), np.dtype("float32"), block=6)
    >>> bool((a == np.random.default_rng(0).normal(0.0, 0.5, (5, 3)).astype("float32")).all())
    True
    """
    out = np.empty(shape, dtype)
    rows = max(1, block // max(1, int(np.prod(shape[1:]))))
    for start in range(0, shape[0], rows):
        block = out[start:start + rows]
        block[...] = rng.normal(0.0, std, size=block.shape)
    return out


def zoo_names() -> Tuple[str, ...]:
    """Names accepted by :func:`load_model` for built-in models.

    Examples
    --------
    >>> "resnet-50" in zoo_names()
    True
    """
    return tuple(ZOO)


def load_model(
    spec: str,
    batch_size: int = 1,
    dtype: str = "float32",
    weights: str = "he",
    seed: int = 0,
) -> Tuple[tvm.IRModule, Params]:
    """Load a model from the zoo, an ONNX file or a saved Relay module.

    Parameters
    ----------
    spec : str
        A zoo name (:func:`zoo_names`) or a path to ``.onnx``, ``.json``,
        ``.relay`` or ``.txt``.
    batch_size : int
        Batch size of zoo models (files keep their own shapes).
    dtype : str
        Data type of zoo models.
    weights : {"he", "zoo"}
        For zoo models: ``"he"`` re-draws weights with :func:`realistic_params`,
        ``"zoo"`` keeps ``relay.testing``'s own.
    seed : int
        Seed for ``"he"`` weights.

    Returns
    -------
    (IRModule, dict)
        The type-checked module and its parameters.

    Raises
    ------
    ModelError
        Unknown name, missing or unreadable file, or a module that does not
        type-check; the message is one line.

    Examples
    --------
    >>> mod, params = load_model("mlp")
    >>> mod["main"].params[0].name_hint
    'data'
    """
    if weights not in _WEIGHTS:
        raise ModelError(f"weights={weights!r} is not one of {list(_WEIGHTS)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ModelError(f"batch_size must be a positive integer, got {batch_size!r}")
    name = _ALIASES.get(spec, spec)
    if name in ZOO:
        mod, params = ZOO[name].build(batch_size, dtype)
        if weights == "he":
            params = realistic_params(params, seed)
        return _type_checked(mod, spec), params
    _, ext = os.path.splitext(spec)
    loaders = {".onnx": _load_onnx, ".json": _load_json, ".relay": _load_text, ".txt": _load_text}
    if ext.lower() not in loaders:
        if os.path.exists(spec):
            raise ModelError(f"{spec}: unknown model file type {ext!r}; expected one of {sorted(loaders)}")
        raise ModelError(
            f"unknown model {spec!r}: not a file and not a built-in model; "
            f"built-in models: {', '.join(zoo_names())}"
        )
    if not os.path.isfile(spec):
        raise ModelError(f"{spec}: no such file")
    mod, params = loaders[ext.lower()](spec)
    return _type_checked(mod, spec), params


def _type_checked(mod: tvm.IRModule, spec: str) -> tvm.IRModule:
    with _diagnostics() as renders:
        try:
            return relay.transform.InferType()(mod)
        except tvm.TVMError as err:
            found = [diag for render in renders for diag in render]
            if not found:
                raise ModelError(f"{spec}: {_TYPE_ERROR}: {_first_line(err)}") from None
            where, _, message = _diagnostic_line(found[0]).partition(": ")
            raise ModelError(f"{spec}{where}: {_TYPE_ERROR}: {message}") from None


#: How a module that does not type-check is reported (after the file name and location).
_TYPE_ERROR = "type error (the module does not type-check)"


@contextlib.contextmanager
def _diagnostics():
    """Collect the diagnostics TVM renders inside the block instead of printing them.

    Yields a list that receives, per render, the list of error diagnostics.
    TVM's default renderer prints each error over several lines (source
    excerpt, carets); the caller reports the first one as one line. TVM keeps
    one custom renderer per process: the default one is back after the block.
    """
    from tvm.ir import diagnostics

    renders: list = []

    def collect(ctx) -> None:
        renders.append([d for d in ctx.diagnostics if int(d.level) <= int(diagnostics.DiagnosticLevel.ERROR)])

    diagnostics.override_renderer(collect)
    try:
        yield renders
    finally:
        diagnostics.override_renderer(None)


def _diagnostic_line(diag) -> str:
    """``":LINE:COLUMN: message"`` for a TVM diagnostic (``": message"`` without a location), first line only.

    Placed after a file name, it reads as compilers write errors, which editors can jump to.
    """
    lines = str(diag.message).strip().splitlines()
    message = lines[0] if lines else "error"
    span = diag.span
    return f": {message}" if span is None else f":{span.line}:{span.column}: {message}"


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    # TVM puts the useful sentence after a traceback; prefer the last "Error" line.
    errors = [line for line in lines if "rror" in line]
    return (errors[-1] if errors else (lines[0] if lines else type(err).__name__))[:300]


def _sidecar_params(path: str, recorded: Optional[str] = None) -> Params:
    """The ``.params`` beside ``path``, checked against the fingerprint the graph recorded.

    ``recorded`` is None for graphs saved without one (older saves, other
    tools): then any ``.params`` is taken as before.
    """
    params_path = _params_path(path)
    if not os.path.isfile(params_path):
        if recorded:
            raise ModelError(f"{path}: was saved with parameters, but {params_path} is missing")
        return {}
    try:
        with open(params_path, "rb") as handle:
            params = dict(relay.load_param_dict(handle.read()))
    except (OSError, tvm.TVMError) as err:
        raise ModelError(f"{params_path}: not a Relay parameter file ({_first_line(err)})") from None
    if recorded is not None and params_fingerprint(params) != recorded:
        raise ModelError(
            f"{params_path} does not belong to {path} (its fingerprint differs from the one the graph "
            "recorded: another model's, or an older save's); save the model again or remove the file"
        )
    return params


def onnx_graph_inputs(graph) -> list:
    """The inputs of an ONNX graph a caller feeds: ``graph.input`` less the initializers listed there.

    Files written before IR version 4 (the onnx package's light models, many
    zoo files) list every weight among the inputs too, so ``graph.input[0]``
    may be a bias.

    Examples
    --------
    >>> import onnx
    >>> from onnx import helper, numpy_helper
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Add", ["b", "x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("b", "x")],
    ...     [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    ...     [numpy_helper.from_array(np.zeros(2, "float32"), "b")])
    >>> [value.name for value in onnx_graph_inputs(graph)]
    ['x']
    """
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers]


def _load_onnx(path: str):
    from ._compat import ensure_onnx_mapping, install_onnx_converters, numpy_first_folding

    install_onnx_converters()  # import tvm_tcutils did it, unless only this module was loaded

    try:
        onnx = ensure_onnx_mapping()
    except ImportError:
        raise ModelError(f"{path}: loading ONNX needs the onnx package: pip install 'tvm-tcutils[ort]'") from None
    from google.protobuf import json_format, message

    # What a missing, corrupt (binary or JSON protobuf) or invalid ONNX file raises.
    unreadable = (OSError, ValueError, message.Error, json_format.Error, onnx.checker.ValidationError)
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except unreadable as err:
        raise ModelError(f"{path}: not a valid ONNX model ({_first_line(err)})") from None
    try:
        # The importer's constant folds in numpy where they are exact (a kernel build each otherwise).
        with numpy_first_folding():
            return relay.frontend.from_onnx(model, freeze_params=True)
    # A boundary: TVM's ONNX frontend fails on models it does not cover with any exception
    # type (OpNotImplemented, KeyError, AssertionError...). The user sees one line; the cause
    # stays chained for --debug.
    except Exception as err:  # noqa: BLE001
        raise ModelError(f"{path}: TVM cannot import this ONNX model ({_first_line(err)})") from err


def _load_json(path: str):
    try:
        with open(path) as handle:
            text = handle.read()
        mod = tvm.ir.load_json(text)
        recorded = json.loads(text).get("attrs", {}).get(_JSON_ATTR)
    except (OSError, ValueError, AttributeError, tvm.TVMError) as err:  # ValueError: not JSON, not UTF-8
        raise ModelError(f"{path}: not a saved Relay module ({_first_line(err)})") from None
    if not isinstance(mod, tvm.IRModule):
        raise ModelError(f"{path}: holds a {type(mod).__name__}, not a Relay IRModule")
    return mod, _sidecar_params(path, recorded)


def _load_text(path: str):
    try:
        with open(path) as handle:
            text = handle.read()
    except (OSError, ValueError) as err:  # ValueError: not UTF-8
        raise ModelError(f"{path}: not a Relay text module ({_first_line(err)})") from None
    # TVM's parser renders its own diagnostics, then type-checks and renders those: an error in
    # the first render is a syntax error, in a later one a type error.
    with _diagnostics() as renders:
        try:
            mod = tvm.relay.fromtext(text, path)
        except tvm.TVMError as err:
            failed = next(((k, found) for k, found in enumerate(renders) if found), None)
            if failed is None:
                raise ModelError(f"{path}: not a Relay text module ({_first_line(err)})") from None
            kind = "syntax error (not a Relay text module)" if failed[0] == 0 else _TYPE_ERROR
            where, _, message = _diagnostic_line(failed[1][0]).partition(": ")
            raise ModelError(f"{path}{where}: {kind}: {message}") from None
    marks = [line[len(_TEXT_MARK):].strip() for line in text.splitlines()[:3] if line.startswith(_TEXT_MARK)]
    return mod, _sidecar_params(path, marks[0] if marks else None)


#: Where a saved graph records the fingerprint of its parameters.
_JSON_ATTR = "tcutils_params"
_TEXT_MARK = "// tcutils-params: "


def params_fingerprint(params: Optional[Params]) -> str:
    """A digest of parameters: names, shapes, dtypes and content (``""`` for none).

    Examples
    --------
    >>> import numpy as np
    >>> a = params_fingerprint({"w": np.zeros((2, 3), "float32")})
    >>> a == params_fingerprint({"w": np.zeros((2, 3), "float32")})
    True
    >>> a == params_fingerprint({"w": np.ones((2, 3), "float32")})
    False
    >>> params_fingerprint(None)
    ''
    """
    if not params:
        return ""
    digest = hashlib.sha256()
    for name in sorted(params):
        value = params[name]
        array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        digest.update(f"{name}|{array.shape}|{array.dtype}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return f"{len(params)}:{digest.hexdigest()[:32]}"


def _params_path(path: str) -> str:
    return os.path.splitext(path)[0] + ".params"


def check_output_path(path: str, overwrite: bool = True, argument: str = "path") -> str:
    """Fail fast, before any work, when a model cannot be saved at ``path``.

    Checks the extension, that the directory exists and is writable, and (with
    ``overwrite=False``) that neither the graph nor its ``.params`` exists.

    Examples
    --------
    >>> check_output_path("/no/such/dir/m.json")
    Traceback (most recent call last):
    ...
    tvm_tcutils.models.ModelError: path /no/such/dir/m.json: directory /no/such/dir does not exist
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in _SAVERS:
        raise ModelError(f"{argument} {path}: cannot save as {ext!r}; use one of {sorted(_SAVERS)}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ModelError(f"{argument} {path}: directory {directory} does not exist")
    if not can_create_in(directory):
        raise ModelError(f"{argument} {path}: directory {directory} is not writable")
    if not overwrite:
        existing = [p for p in (path, _params_path(path)) if os.path.exists(p)]
        if existing:
            raise ModelError(f"{argument} {path}: {' and '.join(existing)} already exist(s); "
                             "choose another path or overwrite (--force)")
    return path


def _json_text(mod: tvm.IRModule, fingerprint: str) -> str:
    saved = json.loads(tvm.ir.save_json(mod))
    saved.setdefault("attrs", {})[_JSON_ATTR] = fingerprint
    return json.dumps(saved)


def _relay_text(mod: tvm.IRModule, fingerprint: str) -> str:
    text = mod.astext(show_meta_data=True)
    first, _, rest = text.partition("\n")
    # After the version line, which the parser wants first.
    return f"{first}\n{_TEXT_MARK}{fingerprint}\n{rest}"


#: File extension -> how a module is written (the fingerprint goes inside).
_SAVERS = {".json": _json_text, ".relay": _relay_text, ".txt": _relay_text}


def save_model(path: str, mod: tvm.IRModule, params: Optional[Params] = None, overwrite: bool = True) -> None:
    """Save a module as JSON (``.json``) or text (``.relay``/``.txt``), params beside it.

    The parameters go to ``<stem>.params`` (``relay.save_param_dict``), which
    :func:`load_model` reads back. The graph records a fingerprint of them
    (:func:`params_fingerprint`), so a ``.params`` file of another model or of
    an older save is refused on load; saving without parameters removes a
    stale ``.params``. Both files are written atomically (temporary file and
    rename), parameters first.

    Examples
    --------
    >>> import tempfile, os
    >>> mod, params = load_model("mlp")
    >>> path = os.path.join(tempfile.mkdtemp(), "mlp.json")
    >>> save_model(path, mod, params)
    >>> loaded, loaded_params = load_model(path)
    >>> tvm.ir.structural_equal(loaded, mod)
    True
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"params must be a dict of name -> array or None, got {type(params).__name__}")
    check_output_path(path, overwrite)
    fingerprint = params_fingerprint(params)
    text = _SAVERS[os.path.splitext(path)[1].lower()](mod, fingerprint)
    if params:
        write_atomically(_params_path(path), bytes(relay.save_param_dict(params)))
    elif os.path.exists(_params_path(path)):
        os.unlink(_params_path(path))
    write_atomically(path, text.encode())


def random_inputs(mod: tvm.IRModule, params: Optional[Params] = None, seed: int = 0) -> Dict[str, np.ndarray]:
    """Random inputs for the free parameters of ``main`` that are not in ``params``.

    Floats are standard normal; integers span their type's full range.

    Examples
    --------
    >>> mod, params = load_model("mlp")
    >>> {k: v.shape for k, v in random_inputs(mod, params).items()}
    {'data': (1, 1, 28, 28)}
    """
    rng = np.random.default_rng(seed)
    params = params or {}
    inputs = {}
    for var in mod["main"].params:
        if var.name_hint in params:
            continue
        ttype = var.checked_type
        shape = [int(dim) for dim in ttype.shape]
        dtype = str(ttype.dtype)
        if dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            inputs[var.name_hint] = rng.integers(info.min, int(info.max) + 1, size=shape, dtype=dtype)
        else:
            inputs[var.name_hint] = rng.standard_normal(shape).astype(dtype)
    return inputs


# --------------------------------------------------------------------------
# ONNX models built in code (weights drawn He-style, seeded), imported with
# relay.frontend.from_onnx: the BERT-like encoder, ResNet-50 and
# MobileNet-v2 as an exporter would write them (batch norm folded into conv
# biases, GELU in its erf form, LayerNormalization from opset 17).
# --------------------------------------------------------------------------
class _OnnxGraph(OnnxGraph):
    """The ONNX writer with seeded, realistically scaled weights and the zoo models' layers."""

    def __init__(self, seed: int):
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def tensor(self, value: np.ndarray, hint: str) -> str:
        # ascontiguousarray makes scalars 1-element vectors, as the zoo models always had them.
        return self.const(np.ascontiguousarray(value), hint)

    def weight(self, shape, fan_in: int, gain: float = 2.0, scale: float = 1.0) -> str:
        std = scale * np.sqrt(gain / fan_in)
        return self.tensor(self.rng.normal(0.0, std, size=shape).astype("float32"), "w")

    def bias(self, size: int, std: float = 0.02) -> str:
        return self.tensor(self.rng.normal(0.0, std, size=(size,)).astype("float32"), "b")

    def ints(self, values, hint: str = "shape") -> str:
        return self.tensor(np.asarray(values, dtype=np.int64), hint)

    def scalar(self, value: float) -> str:
        return self.tensor(np.asarray(value, dtype=np.float32), "c")

    def finish(self, name: str, input_shape, output: str, output_shape):
        """The checked model: float32 ``input`` -> ``output``, IR version at most 8."""
        self.name = name
        self.input("input", "float32", input_shape)
        self.output(output, "float32", output_shape)
        return self.model(max_ir_version=8)

    # -- layers ---------------------------------------------------------------
    def resnet_stem(self, channels: int = 64) -> str:
        """ResNet's 7x7 stride-2 conv (64 channels) with ReLU, then a 3x3 stride-2 max pool."""
        return self.max_pool(self.node("Relu", [self.conv("input", 3, channels, 7, stride=2)]), 3, 2)

    def max_pool(self, x: str, kernel: int, stride: int) -> str:
        """A ``kernel`` x ``kernel`` max pool, padded to keep ``ceil(size / stride)``."""
        return self.node("MaxPool", [x], kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=[kernel // 2] * 4)

    def classifier(self, x: str, channels: int, classes: int = 1000) -> str:
        """Global average pool, flatten, and a fully connected layer to ``classes`` logits."""
        x = self.node("Flatten", [self.node("GlobalAveragePool", [x])], axis=1)
        return self.node("Gemm", [x, self.weight((classes, channels), channels, gain=1.0), self.bias(classes)],
                         transB=1)

    def conv(self, x: str, cin: int, cout: int, kernel: int, stride: int = 1, group: int = 1,
             scale: float = 1.0) -> str:
        fan_in = cin // group * kernel * kernel
        w = self.weight((cout, cin // group, kernel, kernel), fan_in, scale=scale)
        pad = kernel // 2
        return self.node("Conv", [x, w, self.bias(cout)], kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=[pad] * 4, group=group)

    def linear(self, x: str, fan_in: int, fan_out: int, gain: float = 1.0) -> str:
        """``x @ W.T + b`` on 2-d activations, as a Gemm with the weight stored (out, in)."""
        w = self.weight((fan_out, fan_in), fan_in, gain=gain)
        return self.node("Gemm", [x, w, self.bias(fan_out)], transB=1)

    def layer_norm(self, x: str, size: int) -> str:
        gamma = self.tensor(np.ones(size, "float32"), "gamma")
        beta = self.tensor(np.zeros(size, "float32"), "beta")
        return self.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)

    def gelu(self, x: str) -> str:
        inner = self.node("Erf", [self.node("Div", [x, self.scalar(np.sqrt(2.0))])])
        return self.node("Mul", [self.node("Mul", [x, self.node("Add", [inner, self.scalar(1.0)])]), self.scalar(0.5)])


def bert_onnx(batch: int = 1, seq: int = 128, hidden: int = 256, heads: int = 4, layers: int = 4, seed: int = 0):
    """A BERT-like encoder as an ONNX graph: ``layers`` post-norm transformer layers.

    The input is the embedded sequence ``input`` of shape ``(batch, seq,
    hidden)``; each layer has multi-head self-attention (MatMul, Softmax), a
    GELU (erf) feed-forward block of width ``4 * hidden`` and two
    ``LayerNormalization`` nodes (opset 17).

    Examples
    --------
    >>> model = bert_onnx(layers=1, seq=8, hidden=16, heads=2)
    >>> sorted({n.op_type for n in model.graph.node})[:4]
    ['Add', 'Div', 'Erf', 'Gemm']
    """
    if hidden % heads:
        raise ModelError(f"hidden={hidden} is not a multiple of heads={heads}")
    g = _OnnxGraph(seed)
    head = hidden // heads
    # Tokens as rows between layers: every projection is one Gemm.
    x = g.node("Reshape", ["input", g.ints([batch * seq, hidden])])
    for _ in range(layers):
        def split_heads(t, perm):
            return g.node("Transpose", [g.node("Reshape", [t, g.ints([batch, seq, heads, head])])], perm=perm)

        q = split_heads(g.linear(x, hidden, hidden), [0, 2, 1, 3])
        k = split_heads(g.linear(x, hidden, hidden), [0, 2, 3, 1])
        v = split_heads(g.linear(x, hidden, hidden), [0, 2, 1, 3])
        scores = g.node("Div", [g.node("MatMul", [q, k]), g.scalar(np.sqrt(head))])
        probs = g.node("Softmax", [scores], axis=-1)
        context = g.node("Transpose", [g.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.node("Reshape", [context, g.ints([batch * seq, hidden])])
        x = g.layer_norm(g.node("Add", [x, g.linear(context, hidden, hidden)]), hidden)
        ffn = g.linear(g.gelu(g.linear(x, hidden, 4 * hidden, gain=2.0)), 4 * hidden, hidden)
        x = g.layer_norm(g.node("Add", [x, ffn]), hidden)
    out = g.node("Reshape", [x, g.ints([batch, seq, hidden])])
    return g.finish("bert_like_encoder", (batch, seq, hidden), out, (batch, seq, hidden))


def resnet50_onnx(batch: int = 1, seed: int = 0):
    """ResNet-50 v1 as an ONNX graph (batch norm folded into the convolutions' biases).

    The last convolution of each residual branch is scaled down (as trained
    networks' last batch-norm scales are) so that activations keep their
    scale through the 16 blocks.

    Examples
    --------
    >>> model = resnet50_onnx()
    >>> sum(n.op_type == "Conv" for n in model.graph.node)
    53
    """
    g = _OnnxGraph(seed)
    x = g.resnet_stem()
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            y = g.node("Relu", [g.conv(x, cin, width, 1)])
            y = g.node("Relu", [g.conv(y, width, width, 3, stride=stride)])
            y = g.conv(y, width, width * 4, 1, scale=0.2)
            shortcut = g.conv(x, cin, width * 4, 1, stride=stride) if block == 0 else x
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            cin = width * 4
    logits = g.classifier(x, cin)
    return g.finish("resnet50", (batch, 3, 224, 224), logits, (batch, 1000))


def resnet18_onnx(batch: int = 1, seed: int = 0, size: int = 224, width: int = 64):
    """ResNet-18 v1 as an ONNX graph: basic blocks of two 3x3 convolutions (batch norm folded).

    The second convolution of each block is scaled down as in :func:`resnet50_onnx`. ``size`` (the
    image's side) and ``width`` (the first stage's channels) make smaller networks of the same shape.

    Examples
    --------
    >>> model = resnet18_onnx()
    >>> sum(n.op_type == "Conv" for n in model.graph.node)
    20
    >>> [d.dim_value for d in resnet18_onnx(size=64, width=16).graph.input[0].type.tensor_type.shape.dim]
    [1, 3, 64, 64]
    """
    g = _OnnxGraph(seed)
    x = g.resnet_stem(width)
    cin = width
    for stage, channels in enumerate(width * k for k in (1, 2, 4, 8)):
        for block in range(2):
            stride = 2 if block == 0 and stage > 0 else 1
            y = g.node("Relu", [g.conv(x, cin, channels, 3, stride=stride)])
            y = g.conv(y, channels, channels, 3, scale=0.2)
            shortcut = g.conv(x, cin, channels, 1, stride=stride) if stride != 1 or cin != channels else x
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            cin = channels
    logits = g.classifier(x, cin)
    return g.finish("resnet18", (batch, 3, size, size), logits, (batch, 1000))


def mobilenet_v2_onnx(batch: int = 1, seed: int = 0, size: int = 224, width: float = 1.0, stages: int = 7):
    """MobileNet-v2 as an ONNX graph: inverted residuals with ReLU6 (Clip), depthwise 3x3 convolutions.

    ``size`` is the image's side, ``width`` the width multiplier (channels rounded to multiples of 8) and
    ``stages`` how many of the seven stages of inverted residuals are kept (the network's head follows them).

    Examples
    --------
    >>> model = mobilenet_v2_onnx()
    >>> sum(any(a.name == "group" and a.i > 1 for a in n.attribute) for n in model.graph.node)  # depthwise
    17
    """
    g = _OnnxGraph(seed)

    def relu6(t):
        return g.node("Clip", [t, g.scalar(0.0), g.scalar(6.0)])

    def channels(c):
        return max(8, int(c * width + 4) // 8 * 8)

    cin = channels(32)
    x = relu6(g.conv("input", 3, cin, 3, stride=2))
    for expand, cout, repeats, first_stride in (
        (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)
    )[:stages]:
        cout = channels(cout)
        for index in range(repeats):
            stride = first_stride if index == 0 else 1
            hidden = cin * expand
            y = relu6(g.conv(x, cin, hidden, 1)) if expand != 1 else x
            y = relu6(g.conv(y, hidden, hidden, 3, stride=stride, group=hidden))
            y = g.conv(y, hidden, cout, 1, scale=0.5)
            x = g.node("Add", [x, y]) if stride == 1 and cin == cout else y
            cin = cout
    last = max(1280, channels(1280)) if width > 1.0 else 1280
    x = relu6(g.conv(x, cin, last, 1))
    logits = g.classifier(x, last)
    return g.finish("mobilenet_v2", (batch, 3, size, size), logits, (batch, 1000))


def inception_onnx(batch: int = 1, seed: int = 0, size: int = 64, width: int = 16, blocks: int = 2):
    """An Inception-v1-style network as an ONNX graph: a stem, then ``blocks`` inception blocks (four
    branches: 1x1; 1x1 then 3x3; 1x1 then 5x5; 3x3 max pool then 1x1; concatenated on channels), each
    followed by a 3x3 stride-2 max pool, and the classifier.

    Examples
    --------
    >>> model = inception_onnx()
    >>> sum(n.op_type == "Concat" for n in model.graph.node), sum(n.op_type == "MaxPool" for n in model.graph.node)
    (2, 5)
    """
    g = _OnnxGraph(seed)
    x = g.resnet_stem(width)
    cin = width
    for _ in range(blocks):
        def branch(t, cout, kernel):
            return g.node("Relu", [g.conv(t, cin, cout, kernel) if kernel == 1 else g.conv(
                g.node("Relu", [g.conv(t, cin, cin // 2, 1)]), cin // 2, cout, kernel)])

        parts = [branch(x, width, 1), branch(x, 2 * width, 3), branch(x, width // 2, 5),
                 g.node("Relu", [g.conv(g.max_pool(x, 3, 1), cin, width // 2, 1)])]
        x = g.max_pool(g.node("Concat", parts, axis=1), 3, 2)
        cin = 4 * width
    logits = g.classifier(x, cin)
    return g.finish("inception", (batch, 3, size, size), logits, (batch, 1000))


def bert_base_onnx(batch: int = 1, seq: int = 128, seed: int = 0):
    """:func:`bert_onnx` the size of BERT-base: 12 layers, hidden 768, 12 heads (85 M weights, random).

    Examples
    --------
    >>> bert_base_onnx.__name__
    'bert_base_onnx'
    """
    return bert_onnx(batch=batch, seq=seq, hidden=768, heads=12, layers=12, seed=seed)


#: ONNX graphs built in code, by the zoo name that loads them imported into Relay.
ONNX_BUILDERS: Dict[str, Callable] = {
    "bert-tiny-onnx": bert_onnx,
    "bert-base-onnx": bert_base_onnx,
    "resnet-50-onnx": resnet50_onnx,
    "resnet-18-onnx": resnet18_onnx,
    "mobilenet-v2-onnx": mobilenet_v2_onnx,
}


def onnx_model(name: str, batch_size: int = 1):
    """The ONNX graph of a built-in ONNX model (:data:`ONNX_BUILDERS`).

    Examples
    --------
    >>> onnx_model("bert-tiny-onnx").graph.input[0].name
    'input'
    """
    if name not in ONNX_BUILDERS:
        raise ModelError(f"unknown ONNX model {name!r}; built-in ONNX models: {', '.join(ONNX_BUILDERS)}")
    return ONNX_BUILDERS[name](batch=batch_size)


def _onnx_zoo_builder(name: str):
    def build(batch: int, dtype: str):
        if dtype != "float32":
            raise ModelError(f"{name} is built in float32 only, not {dtype}")
        try:
            return relay.frontend.from_onnx(onnx_model(name, batch), freeze_params=True)
        except ImportError:
            raise ModelError(f"{name} needs the onnx package: pip install 'tvm-tcutils[ort]'") from None

    return build


ZOO.update({
    "bert-tiny-onnx": ZooModel("bert-tiny-onnx", _onnx_zoo_builder("bert-tiny-onnx"), (128, 256),
                               "BERT-like encoder (4 layers, hidden 256, 4 heads, seq 128) built as ONNX"),
    "bert-base-onnx": ZooModel("bert-base-onnx", _onnx_zoo_builder("bert-base-onnx"), (128, 768),
                               "BERT-base-sized encoder (12 layers, hidden 768, 12 heads, seq 128) built as ONNX"),
    "resnet-50-onnx": ZooModel("resnet-50-onnx", _onnx_zoo_builder("resnet-50-onnx"), _IMAGE,
                               "ResNet-50 v1 built as ONNX (batch norm folded)"),
    "resnet-18-onnx": ZooModel("resnet-18-onnx", _onnx_zoo_builder("resnet-18-onnx"), _IMAGE,
                               "ResNet-18 v1 built as ONNX (batch norm folded)"),
    "mobilenet-v2-onnx": ZooModel("mobilenet-v2-onnx", _onnx_zoo_builder("mobilenet-v2-onnx"), _IMAGE,
                                  "MobileNet-v2 built as ONNX"),
})
