"""CUDA code generation through the package's plugin, on a machine without a GPU.

The plugin (``cmake/cuda``, ``scripts/build_native.sh``) gives the CUDA-less TVM
wheel TVM's own ``target.build.cuda``, CUDA runtime module and device API; the
package compiles the generated code to a cubin for the target's ``-arch`` with
NVRTC or nvcc (:mod:`tvm_tcutils.cuda`). These tests build kernels, read their
machine code back and save/load them; nothing runs on a GPU (the GPU tests are
at the end of ``tensorcore/test_numerics.py``). Tests that need the plugin skip
with the reason :func:`tvm_tcutils.cuda.status` gives when it is not loaded.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tvm
from tvm import te

import tvm_tcutils
from conftest import _child_env, run_cli, run_python
from tvm_tcutils import cuda, native, registry

STATUS = cuda.status()
needs_plugin = pytest.mark.skipif(
    not STATUS["plugin"], reason=f"the package's CUDA plugin is not loaded: {STATUS['reason'] or 'TVM has its own'}"
)
needs_no_gpu = pytest.mark.skipif(bool(STATUS["device"]), reason="this machine has a GPU: the test is about having none")
TARGET = "cuda -arch=sm_80"
KERNEL = "add_one_kernel"  # tvm.build(..., name="add_one") names the device function so


def _add_one(target: str = TARGET) -> tvm.runtime.Module:
    """A one-kernel TE program built for ``target`` (host: llvm)."""
    x = te.placeholder((256,), "int32", name="x")
    y = te.compute((256,), lambda i: x[i] + 1, name="y")
    sched = te.create_schedule(y.op)
    block, thread = sched[y].split(y.op.axis[0], factor=64)
    sched[y].bind(block, te.thread_axis("blockIdx.x"))
    sched[y].bind(thread, te.thread_axis("threadIdx.x"))
    return tvm.build(sched, [x, y], tvm.target.Target(target, host="llvm"), name="add_one")


def _type_keys(module: tvm.runtime.Module) -> list:
    keys, stack = [], [module]
    while stack:
        current = stack.pop()
        keys.append(current.type_key)
        stack.extend(current.imported_modules)
    return keys


@needs_plugin
def test_plugin_registers_tvms_cuda_code_generator():
    assert tvm.get_global_func("target.build.cuda", allow_missing=True) is not None
    assert tvm.get_global_func("device_api.cuda", allow_missing=True) is not None
    assert tvm.get_global_func("runtime.module.loadbinary_cuda", allow_missing=True) is not None
    assert int(tvm.get_global_func("tvm_tcutils.cuda.abi_version")()) == native.CUDA_ABI_VERSION
    assert STATUS["codegen"] and STATUS["reason"] == "" and STATUS["nvrtc"]
    caps = tvm_tcutils.capabilities()
    assert caps["cuda_codegen"] and caps["cuda_plugin"].endswith(native.CUDA_LIB_NAME)
    assert caps["cuda_toolkit"] == STATUS["toolkit"] and caps["cuda_nvrtc"] == STATUS["nvrtc"]


@needs_plugin
@needs_no_gpu
def test_without_a_driver_there_is_no_device_and_status_says_why():
    assert not tvm.cuda(0).exist
    assert "libcuda" in STATUS["driver"]
    caps = tvm_tcutils.capabilities()
    assert caps["cuda_device"] is False and caps["cuda_arch"] is None
    assert caps["cuda_driver"] == STATUS["driver"]


@needs_plugin
@pytest.mark.parametrize("compiler", cuda.COMPILERS)
def test_te_kernel_builds_to_a_cubin_for_the_targets_arch(compiler, monkeypatch):
    if compiler == "nvcc" and cuda.tool("nvcc") is None:
        pytest.skip("nvcc is not in the CUDA toolkit (pip install 'tvm-tcutils[cuda]')")
    if cuda.tool("cuobjdump") is None:
        pytest.skip("cuobjdump is not in the CUDA toolkit (pip install 'tvm-tcutils[cuda]')")
    monkeypatch.setenv("TVM_TCUTILS_CUDA_COMPILER", compiler)
    programs = []  # which programs run: nvcc is one, NVRTC runs in-process
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: programs.append(os.path.basename(args[0])) or run(args, **kw))
    cubin = cuda.module_cubin(_add_one())
    assert programs == (["nvcc"] if compiler == "nvcc" else [])
    assert cubin[:4] == b"\x7fELF"  # machine code, not PTX
    code = cuda.sass(cubin)
    assert list(code) == [KERNEL]
    assert "EF_CUDA_SM80" in code[KERNEL] and "EXIT" in code[KERNEL]
    use = cuda.resources(cubin)[KERNEL]
    assert use.local == 0 and use.stack == 0 and use.registers > 0


@needs_plugin
def test_export_library_round_trip_keeps_the_cuda_module(tmp_path):
    lib = _add_one()
    path = str(tmp_path / "add_one.so")
    lib.export_library(path)
    loaded = tvm.runtime.load_module(path)
    assert "cuda" in _type_keys(loaded)
    # The cubin travels unchanged: what loads is what was built, without a GPU to run it.
    assert cuda.module_cubin(loaded) == cuda.module_cubin(lib)
    assert loaded.get_function("add_one", query_imports=True) is not None


@needs_plugin
def test_a_saved_library_needs_the_plugin_where_it_is_loaded(tmp_path):
    # The CUDA module's loader comes with the plugin: `import tvm_tcutils` before tvm.runtime.load_module.
    path = str(tmp_path / "add_one.so")
    _add_one().export_library(path)
    result = run_python(
        "import tvm, tvm_tcutils\n"
        f"try:\n    tvm.runtime.load_module({path!r})\nexcept tvm.TVMError as err:\n    print(err)\n",
        env={"TVM_TCUTILS_CUDA_PLUGIN": "/nonexistent/libtvm_tcutils_cuda.so"},
    )
    assert result.returncode == 0, result.stderr
    assert "Binary was created using {cuda} but a loader of that name is not registered" in result.stdout


def test_a_bad_compiler_name_names_the_choices(monkeypatch):
    monkeypatch.setenv("TVM_TCUTILS_CUDA_COMPILER", "clang")
    with pytest.raises(ValueError, match="'clang' is not a CUDA compiler; valid: nvrtc, nvcc"):
        cuda.compiler()
    if STATUS["plugin"]:  # the same error through TVM's build, from the compile callback
        with pytest.raises(ValueError, match="valid: nvrtc, nvcc"):
            _add_one()


@needs_no_gpu
def test_no_arch_and_no_gpu_is_a_value_error():
    with pytest.raises(ValueError, match="names no -arch and there is no GPU"):
        cuda.target_arch(None)
    with pytest.raises(ValueError, match="e.g. 'cuda -arch=sm_80'"):
        cuda.compile_cuda('extern "C" __global__ void k(int* x) { x[0] = 1; }', None)
    assert cuda.target_arch("cuda -arch=sm_86") == "sm_86"


@needs_no_gpu
def test_tvms_default_arch_sm_50_is_a_value_error_that_says_where_it_comes_from():
    # A plain 'cuda' target on a machine without a GPU: TVM writes -arch=sm_50 into it, which CUDA 13
    # does not compile for (NVRTC: "invalid value for --gpu-architecture").
    assert str(tvm.target.Target("cuda").attrs["arch"]) == "sm_50"
    with pytest.raises(ValueError) as caught:
        cuda.target_arch("cuda")
    message = str(caught.value)
    assert message.startswith("target 'cuda' compiles for sm_50, older than sm_75")
    assert "sm_50 is what TVM puts in a 'cuda' target given without -arch when it finds no GPU" in message
    assert message.endswith("e.g. 'cuda -arch=sm_80'")
    if STATUS["plugin"]:  # the same error through TVM's build, from the compile callback
        with pytest.raises(ValueError, match="sm_50 is what TVM puts"):
            _add_one("cuda")


@pytest.mark.parametrize("arch", ["sm_50", "sm_61", "sm_70", "sm_72"])
def test_an_arch_older_than_sm_75_is_a_value_error(arch):
    with pytest.raises(ValueError, match=f"target 'cuda -arch={arch}' compiles for {arch}, older than sm_75") as caught:
        cuda.target_arch(f"cuda -arch={arch}")
    assert ("sm_50 is what TVM puts" in str(caught.value)) == (arch == "sm_50")
    assert cuda.target_arch(tvm.target.Target("cuda -arch=sm_75")) == "sm_75"
    assert cuda.target_arch("cuda -arch=sm_90a") == "sm_90a"


@needs_plugin
@pytest.mark.parametrize("compiler", cuda.COMPILERS)
def test_code_that_does_not_compile_raises_with_the_compilers_message(compiler, monkeypatch):
    if compiler == "nvcc" and cuda.tool("nvcc") is None:
        pytest.skip("nvcc is not in the CUDA toolkit")
    monkeypatch.setenv("TVM_TCUTILS_CUDA_COMPILER", compiler)
    with pytest.raises(RuntimeError, match='identifier "undefined_thing" is undefined') as caught:
        cuda.compile_cuda('extern "C" __global__ void k(int* x) { x[0] = undefined_thing; }', TARGET)
    assert "sm_80" in str(caught.value)


def _make(kind: str, words: int, arg: str) -> str:
    """TVM 0.19's broadcast of one byte: ``make_<kind><words>`` with one argument per byte."""
    return f"make_{kind}{words}(" + ", ".join([arg] * (4 * words)) + ")"


@pytest.mark.parametrize("code, repaired", [
    (_make("int", 4, "(signed char)0"), "make_int4(" + ", ".join(["(int)(0x00000000)"] * 4) + ")"),
    (_make("int", 4, "(signed char)-1"), "make_int4(" + ", ".join(["(int)(0xffffffff)"] * 4) + ")"),
    (_make("int", 4, "(signed char)-128"), "make_int4(" + ", ".join(["(int)(0x80808080)"] * 4) + ")"),
    (_make("int", 2, "(signed char)3"), "make_int2((int)(0x03030303), (int)(0x03030303))"),
    (_make("uint", 4, "(unsigned char)255"), "make_uint4(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff)"),
    # TVM's spelling of a uint8 byte (codegen_cuda.cc: "u" + "char"), and plain char.
    (_make("uint", 4, "(uchar)0"), "make_uint4(0x00000000, 0x00000000, 0x00000000, 0x00000000)"),
    (_make("uint", 2, "(uchar)7"), "make_uint2(0x07070707, 0x07070707)"),
    (_make("uint", 4, "(uchar)v"), "make_uint4(" + ", ".join(["0x01010101u * (unsigned char)(v)"] * 4) + ")"),
    (_make("int", 4, "(char)-2"), "make_int4(" + ", ".join(["(int)(0xfefefefe)"] * 4) + ")"),
    (_make("int", 4, "(signed char)x"), "make_int4(" + ", ".join(["(int)(0x01010101u * (unsigned char)(x))"] * 4) + ")"),
    (_make("int", 2, "(signed char)(a + b)"), "make_int2(" + ", ".join(["(int)(0x01010101u * (unsigned char)((a + b)))"] * 2) + ")"),
    # Two broadcasts in one line, each its own.
    (f"y = {_make('int', 4, '(signed char)0')}; z = {_make('int', 2, '(signed char)1')};",
     "y = make_int4(" + ", ".join(["(int)(0x00000000)"] * 4) + "); z = make_int2((int)(0x01010101), (int)(0x01010101));"),
    # Left alone: what TVM prints correctly, and byte lists that are not one repeated byte.
    ("make_int4(a, b, c, d)", "make_int4(a, b, c, d)"),
    (_make("int", 2, "(signed char)0").replace("make_int2", "make_int4"), None),  # 8 bytes for an int4
    ("make_int4(" + ", ".join(f"(signed char){i}" for i in range(16)) + ")", None),
    ("make_uint4(" + ", ".join(f"(uchar){i}" for i in range(16)) + ")", None),
    ("int v = (int)(signed char)0;", None),
    ("uint v = (uint)(uchar)0;", None),
], ids=["zero", "minus-one", "min", "int2", "uint4", "uchar-zero", "uchar-uint2", "uchar-variable", "char",
        "variable", "expression", "two", "words", "short", "distinct", "uchar-distinct", "scalar", "uchar-scalar"])
def test_repair_source_rewrites_byte_broadcasts_only(code, repaired):
    assert cuda.repair_source(code) == (code if repaired is None else repaired)


@needs_plugin
def test_repaired_int8_fill_compiles_and_the_postproc_hook_repairs():
    code = ('extern "C" __global__ void fill(int4* out, signed char v) {\n'
            f"  out[0] = {_make('int', 4, '(signed char)0')};\n"
            f"  out[1] = {_make('int', 4, '(signed char)v')};\n}}\n")
    with pytest.raises(RuntimeError, match="too many arguments"):
        cuda.compile_cuda(code, TARGET)
    postproc = tvm.get_global_func("tvm_callback_cuda_postproc")
    repaired = str(postproc(code, tvm.target.Target(TARGET)))
    assert repaired == cuda.repair_source(code) != code
    assert cuda.compile_cuda(repaired, TARGET)[:4] == b"\x7fELF"


@needs_plugin
def test_repaired_uint8_fill_compiles():
    code = ('extern "C" __global__ void fill(uint4* out, unsigned char v) {\n'
            f"  out[0] = {_make('uint', 4, '(uchar)0')};\n"
            f"  out[1] = {_make('uint', 4, '(uchar)v')};\n}}\n")
    code = "using uchar = unsigned char;\n" + code  # as in the header TVM generates
    with pytest.raises(RuntimeError, match="too many arguments"):
        cuda.compile_cuda(code, TARGET)
    assert cuda.compile_cuda(cuda.repair_source(code), TARGET)[:4] == b"\x7fELF"


@needs_plugin
def test_unregister_restores_tvms_own_compile_callback():
    # In a child process: unregistering here would take the hooks from the tests that follow.
    result = run_python(
        "import tvm, tvm_tcutils\n"
        "from tvm_tcutils import registry\n"
        "handle = lambda name: getattr(tvm.get_global_func(name, allow_missing=True), 'handle', None)\n"
        "tvms = registry.replaced_func('tvm_callback_cuda_compile')\n"
        "ours = handle('tvm_callback_cuda_compile').value\n"
        "tvm_tcutils.unregister()\n"
        "print(tvms is not None, handle('tvm_callback_cuda_compile').value == tvms.handle.value != ours,"
        " handle('tvm_callback_cuda_postproc') is None)\n"
        "tvm_tcutils.register()\n"
        "print(handle('tvm_callback_cuda_compile').value not in (tvms.handle.value, None))\n",
        fresh=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True", "True"]
    # Here, where the package is registered: the callback is the package's, TVM's is remembered.
    assert registry.replaced_func("tvm_callback_cuda_compile") is not None


def test_package_loads_without_the_plugin_and_says_why():
    # A fresh interpreter: the plugin, once loaded, stays in the process.
    result = run_python(
        "import tvm, tvm_tcutils\n"
        "from tvm_tcutils import cuda\n"
        "info = cuda.status()\n"
        "print(info['codegen'], info['plugin'], tvm_tcutils.capabilities()['cuda_codegen'])\n"
        "print(any(row.name == 'tvm_callback_cuda_compile' for row in tvm_tcutils.registered()))\n"
        "print(info['reason'])\n",
        env={"TVM_TCUTILS_CUDA_PLUGIN": "/nonexistent/libtvm_tcutils_cuda.so"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["False", "False", "False"]
    assert lines[1] == "False"  # no compile callback without the plugin: TVM's own stays
    assert "CUDA plugin is not built" in lines[2] and "docs/cuda.md" in lines[2]


@needs_plugin
def test_info_names_the_plugin_the_toolkit_and_why_there_is_no_device():
    result = run_cli("info")
    assert result.returncode == 0, result.stderr
    lines = dict(re.findall(r"^  (cuda \w+) +(.*)$", result.stdout, re.M))
    plugin = native.library_path(native.CUDA_LIB_NAME, "TVM_TCUTILS_CUDA_PLUGIN")
    assert lines["cuda codegen"] == f"yes (plugin: {plugin}; NVRTC {STATUS['nvrtc']}; toolkit {STATUS['toolkit']})"
    if not STATUS["device"]:
        assert lines["cuda device"] == f"no ({STATUS['driver']})"


def test_info_without_the_plugin_says_why():
    # A fresh interpreter (run_cli's fork server has the plugin loaded), with the plugin named away.
    # The parent's PYTHONPATH stays (where TVM is importable only through it, as on the GPU machine).
    env = _child_env({"TVM_TCUTILS_CUDA_PLUGIN": "/nonexistent/libtvm_tcutils_cuda.so"})
    result = subprocess.run([sys.executable, "-m", "tvm_tcutils", "info"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = dict(re.findall(r"^  (cuda \w+) +(.*)$", result.stdout, re.M))
    assert lines["cuda codegen"].startswith("no (the CUDA plugin is not built")
    assert lines["cuda device"].startswith("no (")
