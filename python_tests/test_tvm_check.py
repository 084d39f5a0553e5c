"""The import-time TVM check and the capability report."""
import os
import textwrap

import tvm_tcutils
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
    assert caps["hexagon_codegen"] == ("hexagon" in caps["llvm_targets"] and caps["hexagon_codegen"])
    assert isinstance(caps["cuda_codegen"], bool)


def test_offline_default_respects_user_setting():
    result = run_python(
        "import os\nfrom tvm_tcutils._tvm import set_offline_defaults\nset_offline_defaults()\n"
        "print(os.environ['TOPHUB_LOCATION'])",
        env={"TOPHUB_LOCATION": "/my/logs"},
    )
    assert result.stdout.strip() == "/my/logs"
