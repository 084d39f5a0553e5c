"""The optional native helper library: builds against the wheel's headers and registers packed functions."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, run_python


@pytest.fixture(scope="module")
def native_lib(tmp_path_factory):
    if not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))):
        pytest.skip("native helpers need cmake and a C++ compiler, not found")
    build = tmp_path_factory.mktemp("native")
    import sys

    result = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "build_native.sh"), sys.executable],
        capture_output=True, text=True, env={**os.environ, "TCUTILS_NATIVE_BUILD": str(build)}, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    path = result.stdout.strip().splitlines()[-1]
    assert os.path.isfile(path)
    return path


def test_native_library_registers_packed_functions(native_lib):
    result = run_python(
        "import tvm_tcutils.native as n\nprint(n.load(), n.get('tvm_tcutils.native.abi_version')())",
        env={"TVM_TCUTILS_NATIVE": native_lib},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "2"]


def test_package_works_without_native_library():
    result = run_python(
        "import tvm_tcutils.native as n\nprint(n.load(), n.get('tvm_tcutils.native.abi_version'))",
        env={"TVM_TCUTILS_NATIVE": "/nonexistent/lib.so"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "None"]
