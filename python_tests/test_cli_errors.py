"""Every command checks its inputs and output paths before any work: one line naming the argument, status 2.

Each bad input must fail in seconds (well under 15 s, TVM's import included),
with one line on stderr that names the option, and leave the directory as it
was. ``-o`` onto an existing model needs ``--force``.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import run_cli

import tvm_tcutils

pytestmark = pytest.mark.timeout(120)

#: Seconds a refused command may take (issue 24: "each fail in under 15 seconds").
FAST = 15.0

TYPE_ERROR_RELAY = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(4, 5), float32]) {
  add(%x, %y)
}
"""


def _files(root) -> set:
    return {os.path.relpath(os.path.join(folder, name), root)
            for folder, _, names in os.walk(root) for name in names}


def _inputs(tmp_path) -> str:
    """Bad input files in ``tmp_path/in``: a type-error Relay module, a text file that is no tuning log."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "typo.relay").write_text(TYPE_ERROR_RELAY)
    (folder / "bad.log").write_text("this is not an AutoTVM record\n{\"input\": [\"llvm\"\n")
    np.savez(folder / "inputs.npz", pixels=np.zeros((1, 1, 28, 28), "float32"))
    (folder / "existing.json").write_text("{}")
    return str(folder)


#: (case id, command line with {in} for the inputs folder, text the one error line must hold): the
#: cases of issues 20 and 24, each run as the user runs it (a new process, timed).
CASES = [
    ("target", ["bench", "mlp", "--target", "banana"], "--target 'banana': not a TVM target"),
    ("toolchain-unknown", ["collage", "mlp", "--toolchains", "tvm,banana"],
     "--toolchains 'tvm,banana': unknown toolchain 'banana'; available: tvm"),
    ("toolchains-empty", ["collage", "mlp", "--toolchains", ""], "--toolchains is empty"),
    ("output-missing-dir", ["prepare", "mlp", "-o", "{in}/no/such/dir/out.json"], "-o "),
    ("output-exists", ["prepare", "mlp", "-o", "{in}/existing.json"], "--force"),
    ("dot-without-graphviz", ["collage", "mlp", "--toolchains", "tvm", "--dot", "picture.svg"], "--dot picture.svg"),
    ("tune-log-missing-dir", ["tune", "mlp", "--log", "{in}/missing/dir/x.log"], "--log"),
    ("bench-log-not-a-log", ["bench", "mlp", "--log", "{in}/bad.log"], "--log"),
    ("type-error-relay", ["count-layers", "{in}/typo.relay"], "typo.relay:3:3: type error"),
]

#: More options, checked in this process (``cli.main``): same rules, without a process start each.
IN_PROCESS = [
    ("target-foreign-cpu", ["bench", "mlp", "--target", "llvm -mtriple=aarch64-linux-gnu"], "--target"),
    ("max-depth", ["collage", "mlp", "--toolchains", "tvm", "--max-depth", "tvm=0"], "--max-depth"),
    ("output-extension", ["prepare", "mlp", "-o", "out.onnx"], "-o out.onnx"),
    ("collage-output-missing-dir", ["collage", "mlp", "--toolchains", "tvm", "-o", "{in}/nodir/p.json"], "-o "),
    ("tune-log-not-a-log", ["tune", "mlp", "--log", "{in}/bad.log"], "--log"),
    # /proc takes no new file even from root, whose os.access says yes to everything: the checks try.
    ("output-in-proc", ["prepare", "mlp", "-o", "/proc/out.json"], "-o /proc/out.json: directory /proc is not"),
    ("cache-dir-in-proc", ["collage", "mlp", "--toolchains", "tvm", "--cache-dir", "/proc/tcutils-cache"],
     "--cache-dir /proc/tcutils-cache: /proc is not writable"),
    ("tune-log-in-proc", ["tune", "mlp", "--log", "/proc/x.log"], "--log /proc/x.log: directory /proc is not"),
    ("bench-log-missing", ["bench", "mlp", "--log", "{in}/none.log"], "--log"),
    ("tuning-log-missing", ["collage", "mlp", "--toolchains", "tvm", "--tuning-log", "{in}/none.log"],
     "--tuning-log"),
    ("error-budget-negative", ["collage", "mlp", "--toolchains", "tvm", "--error-budget", "-0.1"],
     "--error-budget must be at least 0"),
    ("sample-inputs-without-budget", ["collage", "mlp", "--toolchains", "tvm", "--sample-inputs", "{in}/bad.log"],
     "--sample-inputs needs --error-budget"),
    ("sample-inputs-not-npz", ["collage", "mlp", "--toolchains", "tvm", "--error-budget", "0.01",
                               "--sample-inputs", "{in}/bad.log"], "--sample-inputs"),
    ("sample-inputs-missing", ["collage", "mlp", "--toolchains", "tvm", "--error-budget", "0.01",
                               "--sample-inputs", "{in}/none.npz"], "none.npz: no such file"),
    ("sample-inputs-wrong-name", ["collage", "mlp", "--toolchains", "tvm,tvm-fastmath", "--error-budget", "0.01",
                                  "--sample-inputs", "{in}/inputs.npz"],
     "sample_inputs: ['pixels'] are not parameters of main"),
    ("trials", ["tune", "mlp", "--log", "x.log", "--trials", "0"], "--trials must be at least 1, got 0"),
    ("repeat", ["bench", "mlp", "--repeat", "0"], "--repeat must be at least 1"),
    ("workers", ["collage", "mlp", "--toolchains", "tvm", "--workers", "0"], "--workers"),
    ("timeout", ["collage", "mlp", "--toolchains", "tvm", "--timeout", "-1"], "--timeout"),
    ("batch-size", ["count-layers", "mlp", "--batch-size", "0"], "--batch-size"),
    ("ops", ["count-layers", "mlp", "--ops", "nn.conv3"], "--ops"),
    ("out-dtype", ["prepare", "mlp", "-o", "out.json", "--out-dtype", "int33x"], "--out-dtype"),
    ("emulate-target", ["bench", "mlp", "--emulate", "--target", "llvm"], "--target 'llvm': --emulate runs Hexagon"),
    ("emulate-dtype", ["bench", "mlp", "--emulate", "--dtype", "float32"], "--dtype 'float32': --emulate runs"),
    ("emulate-plot", ["bench", "mlp", "--emulate", "--plot", "x.png"], "--plot cannot be used with --emulate"),
    ("emulate-timeout", ["bench", "mlp", "--emulate", "--timeout", "0"], "--timeout"),
    ("per-node-alone", ["bench", "mlp", "--per-node"], "--per-node needs --emulate"),
    ("per-node-choice", ["bench", "mlp", "--emulate", "--target", "hexagon", "--per-node", "most"],
     "--per-node 'most': it names the nodes to record; choose from auto, boundaries, all"),
]


#: The case whose command runs in a new interpreter by default (the time limit is what the user waits, TVM's
#: import included); the others run forked from the tests' fork server (TVM already imported: the same
#: refusal, message, status and files, about 2 s sooner each), and in a new interpreter under -m slow.
FRESH_BY_DEFAULT = "target"


def _bad_input_cases():
    cases = []
    for name, argv, needle in CASES:
        cases.append(pytest.param(argv, needle, True, id=name,
                                  marks=[] if name == FRESH_BY_DEFAULT else [pytest.mark.slow]))
        if name != FRESH_BY_DEFAULT:
            cases.append(pytest.param(argv, needle, False, id=f"{name}-forked"))
    return cases


@pytest.mark.parametrize("argv, needle, fresh", _bad_input_cases())
def test_bad_input_fails_fast_with_one_line(tmp_path, monkeypatch, argv, needle, fresh):
    inputs = _inputs(tmp_path)
    # No Graphviz: PATH without 'dot' (the interpreter is called by its full path).
    monkeypatch.setenv("PATH", str(tmp_path / "in"))
    before = _files(tmp_path)
    start = time.monotonic()
    # fresh: a new interpreter: the time limit is what the user waits, TVM's import included.
    proc = run_cli(*[arg.replace("{in}", inputs) for arg in argv], cwd=str(tmp_path), timeout=120, fresh=fresh)
    seconds = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("tvm-tcutils: error: ") and needle in lines[0], lines[0]
    assert seconds < FAST, f"{seconds:.1f} s"
    assert _files(tmp_path) == before


@pytest.mark.parametrize("argv, needle", [case[1:] for case in IN_PROCESS], ids=[case[0] for case in IN_PROCESS])
def test_bad_option_is_refused_before_work(tmp_path, monkeypatch, capsys, argv, needle):
    from tvm_tcutils import cli

    inputs = _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    status = cli.main([arg.replace("{in}", inputs) for arg in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith("tvm-tcutils: error: ") and needle in lines[0], lines[0]
    assert out == "" and _files(tmp_path) == before


def test_unbuildable_toolchain_is_refused(tmp_path):
    from tvm_tcutils.collage.toolchains import known

    unbuildable = [name for name, tc in known().items() if tc.availability()[0] and not tc.buildable()]
    if not unbuildable:
        pytest.skip("every toolchain available here can be built")
    proc = run_cli("collage", "mlp", "--toolchains", f"tvm,{unbuildable[0]}", cwd=str(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"--toolchains 'tvm,{unbuildable[0]}': {unbuildable[0]} cannot be built here" in lines[0]
    assert os.listdir(tmp_path) == []


def test_output_needs_force_to_replace(tmp_path):
    out = str(tmp_path / "out.json")
    assert run_cli("prepare", "mlp", "-o", out).returncode == 0
    first = os.path.getmtime(out)
    refused = run_cli("prepare", "mlp", "-o", out)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert os.path.getmtime(out) == first
    forced = run_cli("prepare", "mlp", "-o", out, "--force")
    assert forced.returncode == 0, forced.stderr
    # The input model itself, updated on purpose, needs no --force.
    again = run_cli("prepare", out, "-o", out)
    assert again.returncode == 0, again.stderr
    tvm_tcutils.load_model(out)


def test_type_error_relay_file_is_one_line_model_error(tmp_path):
    path = tmp_path / "typo.relay"
    path.write_text(TYPE_ERROR_RELAY)
    with pytest.raises(tvm_tcutils.models.ModelError) as info:
        tvm_tcutils.load_model(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:3:3: type error") and "Incompatible broadcast" in message
    assert "\n" not in message and "not a Relay text module" not in message
    path.write_text(TYPE_ERROR_RELAY.replace("add(%x, %y)", "add(%x, "))
    with pytest.raises(tvm_tcutils.models.ModelError, match="syntax error .not a Relay text module."):
        tvm_tcutils.load_model(str(path))


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0
    tvm_version = tvm_tcutils.capabilities()["tvm_version"]
    assert proc.stdout.strip() == f"tvm-tcutils {tvm_tcutils.__version__} (TVM {tvm_version})"


def test_tvm_warnings_only_with_verbose(tmp_path):
    # prepare's ConvertLayout warns from C++ about pooling layers without a desired layout.
    quiet = run_cli("prepare", "resnet-18", "-o", str(tmp_path / "a.json"))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.strip() == ""
    verbose = run_cli("prepare", "resnet-18", "-o", str(tmp_path / "b.json"), "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "Warning: Desired layout(s) not specified" in verbose.stderr
    both = run_cli("-q", "-v", "info")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_emulate_without_the_hexagon_tools_fails_before_loading_the_model(monkeypatch, capsys):
    from tvm_tcutils import cli
    from tvm_tcutils.commands import _common
    from tvm_tcutils.dotprod import hexagon_profile

    monkeypatch.setattr(hexagon_profile, "missing_profile_tools", lambda: ["qemu-hexagon", "clang-16"])
    monkeypatch.setattr(_common, "load_model_arg", lambda args: pytest.fail("loaded the model"))
    assert cli.main(["bench", "mlp", "--target", "hexagon", "--emulate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("tvm-tcutils: error: --emulate needs qemu-hexagon, clang-16 (apt-get install qemu-user clang-16 "
                   "lld-16; scripts/test.sh installs them)")
