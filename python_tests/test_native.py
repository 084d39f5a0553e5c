"""The native plugins: build against the wheel's headers and register packed functions.

``scripts/build_native.sh`` prints one path a line: the CUDA plugin first (where a CUDA
toolkit and the TVM source headers are found), the helper library last.
"""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_python
from tvm_tcutils import native


@pytest.fixture(scope="module")
def native_build() -> subprocess.CompletedProcess:
    """``scripts/build_native.sh`` run as ``scripts/_venv.sh`` runs it: into ``cmake/build``.

    Incremental there (seconds); a fresh checkout (CI) builds it from scratch in ``_venv.sh`` first,
    and a second from-scratch build here would cost half a minute of the suite for nothing new.
    """
    if not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))):
        pytest.skip("native helpers need cmake and a C++ compiler, not found")
    env = {key: value for key, value in os.environ.items() if key != "TCUTILS_NATIVE_BUILD"}
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "build_native.sh"), sys.executable],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stderr
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


def test_a_rebuild_never_writes_into_a_library_in_use(native_build, tmp_path):
    # A process that has the library loaded maps the file it had: a second build (here a cache hit, or
    # cmake's relink) must leave that file's bytes alone -- writing into it crashed the test process.
    import hashlib

    paths = native_build.stdout.strip().splitlines()
    handles = [open(path, "rb") for path in paths]
    try:
        before = [hashlib.sha256(handle.read()).hexdigest() for handle in handles]
        env = {key: value for key, value in os.environ.items() if key != "TCUTILS_NATIVE_BUILD"}
        for cache in ("", str(tmp_path / "cache")):  # no cache (cmake), then an empty cache, then a hit
            for _ in range(1 + bool(cache)):
                again = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_native.sh"), sys.executable],
                                       capture_output=True, text=True, timeout=600,
                                       env={**env, "TCUTILS_NATIVE_CACHE": cache})
                assert again.returncode == 0, again.stderr
                assert again.stdout.strip().splitlines() == paths
        for handle in handles:
            handle.seek(0)
        assert [hashlib.sha256(handle.read()).hexdigest() for handle in handles] == before
    finally:
        for handle in handles:
            handle.close()


def test_package_works_without_native_library():
    result = run_python(
        "import tvm_tcutils.native as n\nprint(n.load(), n.get('tvm_tcutils.native.abi_version'))",
        env={"TVM_TCUTILS_NATIVE": "/nonexistent/lib.so"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "None"]
