"""Old import paths of the package: the new module itself, with one DeprecationWarning."""
from __future__ import annotations

import importlib
import json

import pytest

from tvm_tcutils._moved import MOVED, new_name

OLD_PATHS = sorted(MOVED) + ["tvm_tcutils.isa.base", "tvm_tcutils.topi.dot_product.packing",
                             "tvm_tcutils.passes.recast"]

# Each old path in a fresh state (the alias and its moved parents dropped from sys.modules), so
# that every import goes through the alias again; one interpreter for all of them.
_PROBE = """
import importlib, json, sys, warnings
import tvm_tcutils
out = {}
for old, new in json.loads(sys.argv[1]).items():
    for name in [n for n in sys.modules if n.startswith("tvm_tcutils.") and new_name(n)]:
        del sys.modules[name]
    module = importlib.import_module(new)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        same = importlib.import_module(old) is module
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    out[old] = {"same": same, "spec": module.__spec__.name, "warnings": messages}
print(json.dumps(out))
""".replace("new_name(n)", "tvm_tcutils._moved.new_name(n)")


@pytest.fixture(scope="module")
def probed():
    from conftest import run_python

    paths = {old: new_name(old) for old in OLD_PATHS}
    # Forked from the tests' fork server (the package imported, as the probe's first line does): the probe
    # drops the moved modules from sys.modules itself before each import.
    out = run_python(_PROBE.replace("sys.argv[1]", repr(json.dumps(paths))), timeout=300, fresh=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_path_is_the_new_module_and_warns(probed, old):
    result = probed[old]
    assert result["same"] and result["spec"] == new_name(old)
    # The first moved name on the path warns (a moved parent package before its child).
    assert result["warnings"], result
    warned = result["warnings"][0].split(" moved to ", 1)[0]
    assert old == warned or old.startswith(warned + "."), result


def test_current_packages_are_not_shadowed():
    # Parents of moved paths that still exist (collage.toolchains) stay the real packages.
    toolchains = importlib.import_module("tvm_tcutils.collage.toolchains")
    assert toolchains.__file__.endswith("collage/toolchains/__init__.py")
    assert new_name("tvm_tcutils.collage.toolchains") is None and new_name("tvm_tcutils.models") is None
