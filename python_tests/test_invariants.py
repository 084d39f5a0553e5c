"""Package-wide invariants: importing tvm_tcutils changes nothing it does not take over."""
import json

import numpy as np
import pytest

import tvm_tcutils

from conftest import run_python

_BUILD = """
import json, os, sys
import numpy as np
{imports}
import tvm
from tvm import relay
from tvm.contrib import graph_executor
from tvm_tcutils.models import load_model, random_inputs
mod, params = load_model("{model}")
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target="{target}", params=params)
m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
m.set_input(**random_inputs(mod, params))
m.run()
np.save(sys.argv[1] if len(sys.argv) > 1 else "{out}", m.get_output(0).numpy())
print(json.dumps({{"graph": lib.get_graph_json(), "loaded": "tvm_tcutils" in sys.modules}}))
"""


def _build(tmp_path, model, target, with_package):
    out = tmp_path / f"{with_package}.npy"
    # Without the package only tvm_tcutils.models is imported, which installs no hooks.
    imports = "import tvm_tcutils" if with_package else (
        "import importlib.util, sys\n"
        "spec = importlib.util.find_spec('tvm_tcutils')\n"
        "pkg = importlib.util.module_from_spec(spec)\n"
        "pkg.__path__ = spec.submodule_search_locations\n"
        "sys.modules['tvm_tcutils'] = pkg  # bare package: __init__ (and register()) not run"
    )
    result = run_python(_BUILD.format(imports=imports, model=model, target=target, out=out), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    info = json.loads(result.stdout.strip().splitlines()[-1])
    return info["graph"], np.load(out)


@pytest.mark.parametrize(
    "model,target",
    # The host CPU's own target: the package's dot-product hooks are installed for it (VNNI, AVX2
    # or SSE4.2) and its code runs here, whatever this machine is.
    [("squeezenet1.1", "llvm"), ("resnet-18", tvm_tcutils.host_target()), ("mlp", tvm_tcutils.host_target())],
)
def test_float_model_same_graph_and_outputs_with_and_without_package(tmp_path, model, target):
    graph_without, out_without = _build(tmp_path, model, target, with_package=False)
    graph_with, out_with = _build(tmp_path, model, target, with_package=True)
    assert graph_with == graph_without
    np.testing.assert_array_equal(out_with, out_without)


def test_bare_package_import_installs_no_hooks():
    result = run_python(
        "import importlib.util, sys\n"
        "spec = importlib.util.find_spec('tvm_tcutils')\n"
        "pkg = importlib.util.module_from_spec(spec); pkg.__path__ = spec.submodule_search_locations\n"
        "sys.modules['tvm_tcutils'] = pkg\n"
        "import tvm, tvm_tcutils.models\n"
        "print(getattr(tvm, '_tvm_tcutils_state', {}).get('installed', {}) == {})\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
