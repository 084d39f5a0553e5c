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

import dataclasses
import os
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ._tvm import tvm
from tvm import relay

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
        value = params[name].numpy()
        shape, dtype = value.shape, value.dtype
        if name.endswith(("_gamma", "_moving_var")):
            new = np.ones(shape)
        elif name.endswith(("_beta", "_moving_mean", "_bias")):
            new = np.zeros(shape)
        elif len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            new = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)
        else:
            new = value
        out[name] = tvm.nd.array(np.asarray(new, dtype=dtype))
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
    try:
        return relay.transform.InferType()(mod)
    except tvm.TVMError as err:
        raise ModelError(f"{spec}: the module does not type-check: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    # TVM puts the useful sentence after a traceback; prefer the last "Error" line.
    errors = [line for line in lines if "rror" in line]
    return (errors[-1] if errors else (lines[0] if lines else type(err).__name__))[:300]


def _sidecar_params(path: str) -> Params:
    params_path = os.path.splitext(path)[0] + ".params"
    if not os.path.isfile(params_path):
        return {}
    try:
        with open(params_path, "rb") as handle:
            return dict(relay.load_param_dict(handle.read()))
    except Exception as err:
        raise ModelError(f"{params_path}: not a Relay parameter file ({_first_line(err)})") from None


def _load_onnx(path: str):
    from ._compat import ensure_onnx_mapping

    try:
        onnx = ensure_onnx_mapping()
    except ImportError:
        raise ModelError(f"{path}: loading ONNX needs the onnx package: pip install 'tvm-tcutils[ort]'") from None
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except Exception as err:
        raise ModelError(f"{path}: not a valid ONNX model ({_first_line(err)})") from None
    try:
        return relay.frontend.from_onnx(model, freeze_params=True)
    except Exception as err:
        raise ModelError(f"{path}: TVM cannot import this ONNX model ({_first_line(err)})") from None


def _load_json(path: str):
    try:
        with open(path) as handle:
            mod = tvm.ir.load_json(handle.read())
    except Exception as err:
        raise ModelError(f"{path}: not a saved Relay module ({_first_line(err)})") from None
    if not isinstance(mod, tvm.IRModule):
        raise ModelError(f"{path}: holds a {type(mod).__name__}, not a Relay IRModule")
    return mod, _sidecar_params(path)


def _load_text(path: str):
    try:
        with open(path) as handle:
            mod = tvm.relay.fromtext(handle.read())
    except Exception as err:
        raise ModelError(f"{path}: not a Relay text module ({_first_line(err)})") from None
    return mod, _sidecar_params(path)


def save_model(path: str, mod: tvm.IRModule, params: Optional[Params] = None) -> None:
    """Save a module as JSON (``.json``) or text (``.relay``/``.txt``), params beside it.

    The parameters go to ``<stem>.params`` (``relay.save_param_dict``), which
    :func:`load_model` reads back.

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
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        text = tvm.ir.save_json(mod)
    elif ext in (".relay", ".txt"):
        text = mod.astext(show_meta_data=True)
    else:
        raise ModelError(f"{path}: cannot save as {ext!r}; use one of ['.json', '.relay', '.txt']")
    with open(path, "w") as handle:
        handle.write(text)
    if params:
        with open(os.path.splitext(path)[0] + ".params", "wb") as handle:
            handle.write(relay.save_param_dict(params))


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
