"""Old import paths of the package: the new module itself, with one DeprecationWarning."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tvm_tcutils._moved import MOVED, new_name

OLD_PATHS = sorted(MOVED) + ["tvm_tcutils.isa.base", "tvm_tcutils.topi.dot_product.packing",
                             "tvm_tcutils.passes.recast"]


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_path_is_the_new_module_and_warns(old):
    # A fresh interpreter: in this one the old name may already be cached without a new warning.
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import tvm_tcutils\n"
        f"new = importlib.import_module({new_name(old)!r})\n"
        "try:\n"
        f"    importlib.import_module({old!r})\n"
        "except DeprecationWarning as w:\n"
        "    print('WARNED', w)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"print(importlib.import_module({old!r}) is new, new.__spec__.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # The first moved name on the path warns (a moved parent package before its child).
    warned = out.stdout.split("WARNED ", 1)[1].split(" moved to ", 1)[0]
    assert old == warned or old.startswith(warned + "."), out.stdout
    assert out.stdout.strip().endswith(f"True {new_name(old)}")


def test_current_packages_are_not_shadowed():
    # Parents of moved paths that still exist (collage.toolchains) stay the real packages.
    toolchains = importlib.import_module("tvm_tcutils.collage.toolchains")
    assert toolchains.__file__.endswith("collage/toolchains/__init__.py")
    assert new_name("tvm_tcutils.collage.toolchains") is None and new_name("tvm_tcutils.models") is None
