"""Old module paths of the package, kept importable for one release.

Until 0.2 the package was laid out by kind of code (``passes/``, ``strategy/``,
``topi/``, ``isa/``); it is now laid out by capability (``tensorcore/``,
``dotprod/``, ``collage/``). Code that imports an old path gets the new module
itself (the same object, so monkeypatching and ``isinstance`` keep working) and
one :class:`DeprecationWarning` naming the new path.

The table is data: :data:`MOVED` maps each old dotted name to its new one, and a
prefix entry covers every submodule below it (``tvm_tcutils.isa.base`` follows
``tvm_tcutils.isa``).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from typing import Dict, Optional

#: Old module path -> new module path (longest prefix wins).
MOVED: Dict[str, str] = {
    "tvm_tcutils.passes": "tvm_tcutils.tensorcore",
    "tvm_tcutils.passes.hooks": "tvm_tcutils.tensorcore.hooks",
    "tvm_tcutils.passes.hwnc_reference": "tvm_tcutils.tensorcore.topi.hwnc_reference",
    "tvm_tcutils.tensorcore_rules": "tvm_tcutils.tensorcore.rules",
    "tvm_tcutils.strategy.tensorcore": "tvm_tcutils.tensorcore.strategy",
    "tvm_tcutils.strategy.tensorcore_demo": "tvm_tcutils.tensorcore.demo",
    "tvm_tcutils.topi.tensorcore": "tvm_tcutils.tensorcore.topi",
    "tvm_tcutils.strategy.dot_product": "tvm_tcutils.dotprod.strategy",
    "tvm_tcutils.strategy.dot_product_demo": "tvm_tcutils.dotprod.demo",
    "tvm_tcutils.strategy.collage_toolchains": "tvm_tcutils.collage.hooks",
    "tvm_tcutils.topi.dot_product": "tvm_tcutils.dotprod.topi",
    "tvm_tcutils.isa": "tvm_tcutils.dotprod.isa",
    "tvm_tcutils.hexagon_emulation": "tvm_tcutils.dotprod.hexagon",
    "tvm_tcutils.dot_product_tuning": "tvm_tcutils.tuning",
    "tvm_tcutils.collage.toolchains.demo": "tvm_tcutils.collage.demo",
}


def new_name(old: str) -> Optional[str]:
    """The current path of module ``old``, or ``None`` when it did not move.

    Examples
    --------
    >>> new_name("tvm_tcutils.isa.base")
    'tvm_tcutils.dotprod.isa.base'
    >>> new_name("tvm_tcutils.passes.hooks")
    'tvm_tcutils.tensorcore.hooks'
    >>> new_name("tvm_tcutils.models") is None
    True
    """
    best = max((prefix for prefix in MOVED if old == prefix or old.startswith(prefix + ".")),
               key=len, default=None)
    if best is None:
        return None
    return MOVED[best] + old[len(best):]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path is removed in tvm-tcutils 0.2",
            DeprecationWarning, stacklevel=3,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # The module is the new one, already executed; the import machinery just
        # stamped the alias's spec on it, which reload() would then follow.
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("tvm_tcutils."):
            return None
        new = new_name(fullname)
        if new is None:
            # Packages that only ever held moved modules ("tvm_tcutils.strategy")
            # still import, as empty namespaces, so that their moved children resolve.
            if (any(prefix.startswith(fullname + ".") for prefix in MOVED)
                    and importlib.machinery.PathFinder.find_spec(fullname, path) is None):
                return importlib.util.spec_from_loader(fullname, _NamespaceLoader(), is_package=True)
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new), is_package=True)


class _NamespaceLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []


def install() -> None:
    """Make the old paths importable (idempotent; :mod:`tvm_tcutils` calls it).

    Examples
    --------
    >>> install()
    >>> import warnings
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     import tvm_tcutils.tensorcore_rules as old
    >>> import tvm_tcutils.tensorcore.rules as new
    >>> old is new
    True
    """
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        # First: the path finder would otherwise load a second copy of a moved
        # submodule from the (new) parent's directory under its old name.
        sys.meta_path.insert(0, _AliasFinder())
