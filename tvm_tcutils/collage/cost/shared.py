"""Constants shared with measuring workers once per search instead of once per candidate.

Serialising a candidate with ``tvm.ir.save_json`` writes its constants into
the text (base64): a search over VGG-16 sends its 0.5 GB of weights again with
every candidate that reads them. :class:`SharedConstants` writes each large
constant of the model once into a per-search directory (``c<N>.npy``) and
serialises a module with those constants replaced by placeholder variables
(``__shared_const_<N>``), so a payload carries only the graph;
:func:`load_module` in the worker reads the files it names and binds them back.
Constants the model does not hold (made by a rewrite), small ones and dtypes
NumPy cannot store stay inline.

An IRModule refuses functions with free variables, so a module with
placeholders travels as ``[{global var: function}, attrs]`` and becomes a
module again after binding.

Examples
--------
>>> import numpy as np
>>> from tvm import relay
>>> x = relay.var("x", shape=(64, 64))
>>> w = relay.const(np.ones((64, 64), "float32"))
>>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(x, w)))
>>> shelf = SharedConstants([w])
>>> text = shelf.dumps(mod)
>>> len(text) < 64 * 64 * 4, sorted(os.listdir(shelf.directory))
(True, ['c0.npy'])
>>> back = load_module(text, shelf.directory)
>>> float(back["main"].body.args[1].data.numpy().sum())
4096.0
>>> shelf.close()
"""
from __future__ import annotations

import ctypes
import os
import shutil
import sys
import tempfile
from typing import Callable, Dict, Iterable, Optional

import numpy as np

from ..._tvm import tvm
from ...files import atomic_path
from tvm import relay

#: Name prefix of the placeholder variables standing for shared constants.
PREFIX = "__shared_const_"

#: Constants smaller than this (bytes) stay in the payload: a file costs more than it saves.
MIN_BYTES = 4096


def _address(array: tvm.nd.NDArray) -> int:
    # The tensor's address: the same for every Constant holding this array, and stable while it lives.
    return ctypes.cast(array.handle, ctypes.c_void_p).value


def _storable(array: tvm.nd.NDArray) -> bool:
    try:
        np.dtype(array.dtype)
    except TypeError:  # bfloat16, custom types: NumPy cannot write them
        return False
    return True


class _Placeholders(relay.ExprMutator):
    """Replaces each shared constant by its placeholder variable."""

    def __init__(self, shelf: "SharedConstants"):
        super().__init__()
        self.shelf = shelf

    def visit_constant(self, const):
        return self.shelf.placeholder(const) or const


class SharedConstants:
    """The model's large constants written once to a directory; modules serialised without them.

    Parameters
    ----------
    constants : iterable of relay.Constant
        The constants that may be shared (the model's); they are written to
        disk the first time a serialised module reads them.
    directory : str, optional
        Where to write them (default: a new temporary directory, removed by :meth:`close`).
    min_bytes : int
        Smaller constants stay inline.
    """

    def __init__(self, constants: Iterable[relay.Constant], directory: Optional[str] = None,
                 min_bytes: int = MIN_BYTES):
        self._owned = directory is None
        self.directory = tempfile.mkdtemp(prefix="tcutils-collage-constants-") if directory is None else directory
        # The arrays are kept referenced, so an address cannot be reused by another array while we map it.
        self._arrays: Dict[int, tvm.nd.NDArray] = {}
        for const in constants:
            array = const.data
            if _nbytes(array) >= min_bytes and _storable(array):
                self._arrays.setdefault(_address(array), array)
        self._ids: Dict[int, int] = {}
        self._vars: Dict[int, relay.Var] = {}

    def placeholder(self, const: relay.Constant) -> Optional[relay.Var]:
        """The variable standing for ``const`` (its file written on first use), or None if it stays inline."""
        address = _address(const.data)
        array = self._arrays.get(address)
        if array is None:
            return None
        if address not in self._ids:
            number = len(self._ids)
            path = os.path.join(self.directory, f"c{number}.npy")
            with atomic_path(path, suffix=".npy") as partial:  # a worker never reads half a file
                np.save(partial, array.numpy())
            self._ids[address] = number
            self._vars[address] = relay.var(f"{PREFIX}{number}", relay.TensorType(array.shape, array.dtype))
        return self._vars[address]

    def dumps(self, mod: tvm.IRModule) -> str:
        """``mod`` as JSON text, its shared constants as placeholders (see :func:`load_module`)."""
        limit = sys.getrecursionlimit()
        # ExprMutator recurses once per nested expression: whole models are deeper than the default limit.
        sys.setrecursionlimit(max(limit, 100_000))
        try:
            mutator = _Placeholders(self)
            functions = {gv: (mutator.visit(f) if isinstance(f, relay.Function) else f)
                         for gv, f in mod.functions.items()}
        finally:
            sys.setrecursionlimit(limit)
        if all(functions[gv].same_as(f) for gv, f in mod.functions.items()):
            return tvm.ir.save_json(mod)
        return tvm.ir.save_json([functions, mod.attrs])

    def close(self) -> None:
        """Remove the directory (when this object made it)."""
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)


def _nbytes(array: tvm.nd.NDArray) -> int:
    count = 1
    for extent in array.shape:
        count *= int(extent)
    return count * tvm.DataType(array.dtype).bits // 8


def load_module(text: str, directory: Optional[str] = None) -> tvm.IRModule:
    """The module serialised by :meth:`SharedConstants.dumps` (or ``tvm.ir.save_json``), constants bound back.

    Each file is read once per call, so modules timed side by side share one array.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> load_module(tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], x))))["main"].params[0].name_hint
    'x'
    """
    return load_modules([text], directory)[0]


def load_modules(texts, directory: Optional[str] = None,
                 stand_in: Optional[Callable[[relay.Var], relay.Expr]] = None):
    """Several serialised modules, each shared constant read once for all of them.

    ``stand_in(placeholder)``, when given, makes what replaces a shared constant
    instead of reading its file: a module to type-check without its weights
    (see :func:`tvm_tcutils.collage.cost.workers.task_bytes`).
    """
    loaded: Dict[str, relay.Expr] = {}

    def constant(var: relay.Var) -> relay.Expr:
        name = var.name_hint
        if name not in loaded:
            if stand_in is not None:
                loaded[name] = stand_in(var)
            elif directory is None:
                raise ValueError(f"module reads shared constant {name} but no constants directory was given")
            else:
                loaded[name] = relay.const(np.load(os.path.join(directory, f"c{name[len(PREFIX):]}.npy")))
        return loaded[name]

    out = []
    for text in texts:
        obj = tvm.ir.load_json(text)
        if isinstance(obj, tvm.IRModule):
            out.append(obj)
            continue
        functions, attrs = obj
        bound = {}
        for gv, func in functions.items():
            if isinstance(func, relay.Function):
                free = [v for v in relay.analysis.free_vars(func) if v.name_hint.startswith(PREFIX)]
                if free:  # bound in the body: binding a function checks that free variables stay free
                    body = relay.bind(func.body, {v: constant(v) for v in free})
                    func = relay.Function(func.params, body, func.ret_type, func.type_params, func.attrs)
            bound[gv] = func
        out.append(tvm.IRModule(bound, attrs=attrs))
    return out
