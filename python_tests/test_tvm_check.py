"""The import-time TVM check and the capability report."""
import os
import textwrap

import tvm_tcutils
import tvm
from conftest import run_python


def _fake_tvm(tmp_path, with_relay: bool):
    pkg = tmp_path / "tvm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "0.25.0"\n')
    if with_relay:
        (pkg / "relay.py").write_text("")
    return str(tmp_path)


def test_tvm_without_relay_gives_clear_import_error(tmp_path):
    path = _fake_tvm(tmp_path, with_relay=False)
    result = run_python(
        textwrap.dedent(
            """
            try:
                import tvm_tcutils
            except ImportError as err:
                print(err)
            else:
                print("imported")
            """
        ),
        env={"PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(tvm_tcutils.__file__)), path])},
    )
    out = result.stdout
    assert "found tvm 0.25.0" in out
    assert "tvm.relay" in out
    assert "pip install 'tvm-tcutils[tvm]'" in out
    assert "xtc-tvm-python-bindings==0.19.0.12" in out


def test_no_tvm_gives_clear_import_error(tmp_path):
    # A 'tvm' that fails to import stands for an environment without TVM.
    pkg = tmp_path / "tvm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('No module named tvm')\n")
    result = run_python(
        "try:\n import tvm_tcutils\nexcept ImportError as err:\n print(err)\n",
        env={"PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(tvm_tcutils.__file__)), str(tmp_path)])},
    )
    assert "no usable 'tvm' module was found" in result.stdout
    assert "pip install 'tvm-tcutils[tvm]'" in result.stdout


def test_capabilities_report_this_build():
    caps = tvm_tcutils.capabilities()
    assert caps["relay"] and caps["autotvm"]
    assert caps["llvm_version"] > 0
    assert any(t.startswith("x86") or t.startswith("aarch64") for t in caps["llvm_targets"])
    # Hexagon codegen needs a Hexagon LLVM backend as well as TVM's builder.
    has_builder = tvm.get_global_func("target.build.hexagon", allow_missing=True) is not None
    assert caps["hexagon_codegen"] == ("hexagon" in caps["llvm_targets"] and has_builder)
    assert isinstance(caps["cuda_codegen"], bool)
    assert caps["native_helpers"] is None or os.path.isfile(caps["native_helpers"])


def test_offline_default_respects_user_setting():
    result = run_python(
        "import os\nfrom tvm_tcutils._tvm import set_offline_defaults\nset_offline_defaults()\n"
        "print(os.environ['TOPHUB_LOCATION'])",
        env={"TOPHUB_LOCATION": "/my/logs"},
    )
    assert result.stdout.strip() == "/my/logs"


def test_host_target_claims_only_features_this_cpu_reports():
    # A VM can report a CPU model (e.g. znver4) while hiding some of its features (AVX-512):
    # code built for the bare model then dies with SIGILL.
    reported = dict(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")())
    host = {str(k) for k, on in reported.items() if on}
    reported = {str(k) for k in reported}
    claimed = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(tvm_tcutils.host_target()))}
    assert not (claimed & reported) - host, sorted((claimed & reported) - host)


def test_host_target_masks_a_hidden_feature(monkeypatch):
    from tvm_tcutils import _tvm

    # A host that reports everything of znver4 except AVX-512 foundation.
    model = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target("llvm -mcpu=znver4"))}
    fake_host = {f: f != "avx512f" for f in model}
    real_get = tvm.get_global_func

    def get_global_func(name, *args, **kwargs):
        if name == "tvm.codegen.llvm.GetHostCPUFeatures":
            return lambda: fake_host
        return real_get(name, *args, **kwargs)

    monkeypatch.setattr(tvm, "get_global_func", get_global_func)
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "znver4")
    _tvm.host_target.cache_clear()
    _tvm._features_hidden_from_host.cache_clear()
    try:
        target = _tvm.host_target()
        assert target == "llvm -mcpu=znver4 -mattr=-avx512f"
        assert not tvm.target.codegen.target_has_features(["avx512vnni"], tvm.target.Target(target))
    finally:
        _tvm.host_target.cache_clear()
        _tvm._features_hidden_from_host.cache_clear()
