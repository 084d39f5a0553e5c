"""The native plugins: build against the wheel's headers and register packed functions.

``scripts/build_native.sh`` prints one path a line: the CUDA plugin first (where a CUDA
toolkit and the TVM source headers are found), the helper library last.
"""
import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, run_python
from tvm_tcutils import native


#: Run by the fixture: the build, from a process that has the package's libraries loaded (as the test
#: processes have while scripts/_venv.sh or this file build again), which then calls into them.
_BUILD_WHILE_LOADED = """
import json, os, subprocess, sys
import tvm_tcutils
from tvm_tcutils import native
loaded = native.load()
env = {key: value for key, value in os.environ.items() if key != "TCUTILS_NATIVE_BUILD"}
done = subprocess.run(["bash", sys.argv[1], sys.executable], capture_output=True, text=True, env=env)
abi = native.get("tvm_tcutils.native.abi_version")() if loaded else None
print(json.dumps({"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "abi": abi}))
"""


@pytest.fixture(scope="module")
def native_build() -> subprocess.CompletedProcess:
    """``scripts/build_native.sh`` run as ``scripts/_venv.sh`` runs it: into ``cmake/build``, from a process
    that has the libraries built before loaded (when there are any), as a test process has them.

    Incremental there (seconds); a fresh checkout (CI) builds it from scratch in ``_venv.sh`` first,
    and a second from-scratch build here would cost half a minute of the suite for nothing new.
    """
    if not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))):
        pytest.skip("native helpers need cmake and a C++ compiler, not found")
    script = os.path.join(ROOT, "scripts", "build_native.sh")
    host = run_python(_BUILD_WHILE_LOADED.replace("sys.argv[1]", repr(script)), timeout=600)
    # The loading process survived the build and could still call into what it had loaded.
    assert host.returncode == 0, (host.returncode, host.stderr[-2000:])
    report = json.loads(host.stdout.strip().splitlines()[-1])
    assert report["returncode"] == 0, report["stderr"]
    result = subprocess.CompletedProcess(["bash", script], report["returncode"], report["stdout"], report["stderr"])
    result.abi_while_loaded = report["abi"]
    return result


@pytest.fixture(scope="module")
def native_lib(native_build) -> str:
    path = native_build.stdout.strip().splitlines()[-1]  # the helper library is always the last line
    assert os.path.basename(path) == "libtvm_tcutils_native.so" and os.path.isfile(path)
    return path


@pytest.fixture(scope="module")
def cuda_plugin(native_build) -> str:
    paths = native_build.stdout.strip().splitlines()
    if len(paths) == 1:
        notes = " ".join(line for line in native_build.stderr.splitlines() if line.startswith("note:"))
        pytest.skip(f"build_native.sh built no CUDA plugin here: {notes or 'no note'}")
    return paths[0]


def test_build_prints_the_cuda_plugin_first_and_the_helpers_last(native_build):
    paths = native_build.stdout.strip().splitlines()
    names = [os.path.basename(path) for path in paths]
    assert names in (["libtvm_tcutils_native.so"], ["libtvm_tcutils_cuda.so", "libtvm_tcutils_native.so"]), names
    assert all(os.path.isfile(path) for path in paths)


def test_built_cuda_plugin_loads_and_provides_cuda_codegen(cuda_plugin):
    result = run_python(
        "import tvm, tvm_tcutils\nfrom tvm_tcutils import cuda\ninfo = cuda.status()\n"
        "print(info['plugin'], info['codegen'], tvm.get_global_func('tvm_tcutils.cuda.abi_version')())",
        env={"TVM_TCUTILS_CUDA_PLUGIN": cuda_plugin},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", str(native.CUDA_ABI_VERSION)]


def test_native_library_registers_packed_functions(native_lib):
    result = run_python(
        "import tvm_tcutils.native as n\nprint(n.load(), n.get('tvm_tcutils.native.abi_version')())",
        env={"TVM_TCUTILS_NATIVE": native_lib},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "2"]


def test_a_rebuild_leaves_the_libraries_a_process_has_loaded_intact(native_build):
    # The fixture built from a process with the libraries loaded. A copy written into a loaded file (a
    # cache hit copied with cp) crashed such processes (SIGSEGV: the test process's exit code 139).
    if native_build.abi_while_loaded is None:
        pytest.skip("no native library was built before this run: nothing was loaded during the build")
    assert native_build.abi_while_loaded == 2


def test_package_works_without_native_library():
    result = run_python(
        "import tvm_tcutils.native as n\nprint(n.load(), n.get('tvm_tcutils.native.abi_version'))",
        env={"TVM_TCUTILS_NATIVE": "/nonexistent/lib.so"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "None"]
