"""Checks of the arguments of Collage's public functions, made before any long work starts.

Each check raises ``TypeError`` (wrong kind of value) or ``ValueError``
(right kind, wrong value) with a message that starts with the argument's name
and says what is valid, instead of TVM's ``DiagnosticError`` from deep inside a
pass minutes later. None of them changes its argument.

Examples
--------
>>> whole_number("validate_rounds", 1.5)
Traceback (most recent call last):
...
TypeError: validate_rounds must be an int >= 0, got float 1.5
>>> whole_number("validate_rounds", 2)
2
"""
from __future__ import annotations

import numbers
import os
from typing import Dict, Mapping, Optional

import numpy as np

from .._tvm import tvm
from tvm import relay


def whole_number(name: str, value, least: int = 0) -> int:
    """``value`` if it is an int (not a bool) of at least ``least``.

    Examples
    --------
    >>> whole_number("workers", 0, least=1)
    Traceback (most recent call last):
    ...
    ValueError: workers must be an int >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {least}, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


def positive_number(name: str, value, zero: bool = False) -> float:
    """``value`` as a float if it is a real number above 0 (or at least 0 with ``zero``).

    Examples
    --------
    >>> positive_number("timeout", "60")
    Traceback (most recent call last):
    ...
    TypeError: timeout must be a number > 0, got str '60'
    """
    bound = ">= 0" if zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number {bound}, got {type(value).__name__} {value!r}")
    if not (value >= 0 if zero else value > 0):
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")
    return float(value)


def flag(name: str, value) -> bool:
    """``value`` if it is a bool.

    Examples
    --------
    >>> flag("compare_single", "yes")
    Traceback (most recent call last):
    ...
    TypeError: compare_single must be True or False, got str 'yes'
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def choice(name: str, value, choices) -> str:
    """``value`` if it is one of ``choices``.

    Examples
    --------
    >>> choice("executor", "aot", ("graph", "vm"))
    Traceback (most recent call last):
    ...
    ValueError: executor must be one of ['graph', 'vm'], got 'aot'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def target(value: Optional[str], name: str = "target") -> Optional[str]:
    """``value`` if TVM parses it as a target (None stays None: the host target).

    Examples
    --------
    >>> target("no-such-target")
    Traceback (most recent call last):
    ...
    ValueError: target: 'no-such-target' is not a TVM target (e.g. 'llvm', 'llvm -mcpu=skylake-avx512')
    """
    if value is None:
        return None
    if not isinstance(value, (str, tvm.target.Target)):
        raise TypeError(f"{name} must be a target string such as 'llvm', got {type(value).__name__}")
    try:
        tvm.target.Target(value)
    except (tvm.TVMError, ValueError) as err:
        raise ValueError(f"{name}: {value!r} is not a TVM target (e.g. 'llvm', 'llvm -mcpu=skylake-avx512')") \
            from err
    return value


def existing_file(name: str, value: Optional[str]) -> Optional[str]:
    """``value`` if it is None or names a file.

    Examples
    --------
    >>> existing_file("tuning_log", "/no/such.log")
    Traceback (most recent call last):
    ...
    FileNotFoundError: tuning_log: no such file '/no/such.log'
    """
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path, got {type(value).__name__}")
    if not os.path.isfile(value):
        raise FileNotFoundError(f"{name}: no such file {os.fspath(value)!r}")
    return value


def onnx_file(name: str, value) -> str:
    """The absolute path of ``value``, an existing file that parses as an ONNX model (its graph only:
    external weights are not read).

    Examples
    --------
    >>> onnx_file("original", "/no/such.onnx")
    Traceback (most recent call last):
    ...
    FileNotFoundError: original: no such file '/no/such.onnx'
    """
    existing_file(name, value)
    import onnx
    from google.protobuf.message import DecodeError

    try:
        onnx.load(os.fspath(value), load_external_data=False)
    except (DecodeError, OSError, ValueError) as err:  # their messages name no argument
        raise ValueError(f"{name}: {os.fspath(value)!r} is not an ONNX model ({type(err).__name__}: {err})") from None
    return os.path.abspath(value)


def typed_main(mod, name: str = "mod") -> relay.Function:
    """``mod["main"]`` after type inference; ``mod`` is not changed.

    Raises
    ------
    TypeError
        ``mod`` is not an IRModule, or does not type-check (with TVM's reason).
    ValueError
        ``mod`` has no ``main``.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,)); y = relay.var("y", shape=(3,))
    >>> typed_main(tvm.IRModule.from_expr(relay.Function([x, y], relay.add(x, y))))
    Traceback (most recent call last):
    ...
    TypeError: mod does not type-check: ...
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"{name} must be a tvm.IRModule, got {type(mod).__name__}")
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"{name} has no 'main' function; it has {[gv.name_hint for gv in mod.get_global_vars()]}")
    try:
        return relay.transform.InferType()(mod)["main"]
    except tvm.TVMError as err:  # DiagnosticError and the checks behind it
        reason = str(err).strip().splitlines()
        raise TypeError(f"{name} does not type-check: {reason[-1] if reason else type(err).__name__}") from err


def _var_type(var: relay.Var):
    if var.type_annotation is not None:
        return var.type_annotation
    try:
        return var.checked_type
    except ValueError:  # not type-checked: nothing to compare with
        return None


def params_for(main: relay.Function, params, name: str = "params") -> Dict[str, tvm.nd.NDArray]:
    """``params`` checked against ``main``'s parameters: a dict of arrays, each naming one, of its shape and dtype.

    Returns a new dict (``params`` is not changed); arrays may be NumPy or TVM arrays.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,)); w = relay.var("w", shape=(2,))
    >>> main = relay.Function([x, w], relay.add(x, w))
    >>> sorted(params_for(main, {"w": np.ones(2, "float32")}))
    ['w']
    >>> params_for(main, {"v": np.ones(2, "float32")})
    Traceback (most recent call last):
    ...
    ValueError: params: ['v'] are not parameters of main; its parameters: ['x', 'w']
    >>> params_for(main, {"w": np.ones(3, "float32")})
    Traceback (most recent call last):
    ...
    ValueError: params: 'w' has shape (3,) float32, main's parameter is (2,) float32
    """
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TypeError(f"{name} must be a dict of parameter name -> array, got {type(params).__name__}")
    names = [p.name_hint for p in main.params]
    unknown = sorted(str(k) for k in params if k not in names)
    if unknown:
        raise ValueError(f"{name}: {unknown[:3]} are not parameters of main; its parameters: {names[:10]}")
    types = {p.name_hint: _var_type(p) for p in main.params}
    out: Dict[str, tvm.nd.NDArray] = {}
    for key, value in params.items():
        if not isinstance(value, (np.ndarray, tvm.nd.NDArray)):
            raise TypeError(f"{name}: {key!r} must be a NumPy or TVM array, got {type(value).__name__}")
        expected = types[key]
        if isinstance(expected, relay.TensorType):
            want = (tuple(int(d) for d in expected.shape), str(expected.dtype))
            got = (tuple(int(d) for d in value.shape), str(value.dtype))
            if want != got:
                raise ValueError(f"{name}: {key!r} has shape {got[0]} {got[1]}, main's parameter is "
                                 f"{want[0]} {want[1]}")
        out[key] = value if isinstance(value, tvm.nd.NDArray) else tvm.nd.array(value)
    return out
