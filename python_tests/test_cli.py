"""The command line: info, demo, shared model errors."""
import os
import subprocess
import sys

import pytest

from conftest import run_cli


def test_info_lists_tvm_capabilities_and_hooks():
    result = run_cli("info", "--models")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for needle in ("TVM 0.", "relay", "autotvm", "llvm", "cuda codegen", "hexagon codegen", "onnxruntime",
                   "native helpers", "registered hooks", "resnet-50", "int8 kernels"):
        assert needle in out, needle


def test_bad_model_exits_nonzero_with_one_line(tmp_path):
    result = run_cli("demo", "no-such-model", cwd=str(tmp_path))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown model 'no-such-model'" in lines[0]
    assert "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # 18 s (the CI budget): every capability end to end; the other CLI tests keep each command
def test_demo_runs_on_builtin_model():
    result = run_cli("demo", "mlp")
    assert result.returncode == 0, result.stderr
    assert "tvm-tcutils demo on mlp" in result.stdout
    assert "outputs finite: True" in result.stdout


def test_import_sets_offline_tophub_default():
    env = {k: v for k, v in os.environ.items() if k != "TOPHUB_LOCATION"}
    code = "import os, tvm_tcutils; print(os.environ.get('TOPHUB_LOCATION'))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "NONE"


def test_every_demo_section_resolves_to_a_documented_function():
    from tvm_tcutils import demo

    assert len(demo.SECTIONS) == len(set(demo.SECTIONS))
    for spec in demo.SECTIONS:
        section = demo._resolve(spec)
        assert callable(section) and (section.__doc__ or "").strip(), spec


def test_output_into_a_closed_pipe_ends_quietly():
    # `tvm-tcutils count-layers MODEL | head -1`: the reader leaves early; no traceback, status 0.
    # A one-page pipe, so the table cannot sit in the pipe's buffer whole.
    code = ("import fcntl, os, subprocess, sys\n"
            "r, w = os.pipe(); fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ\n"
            "p = subprocess.Popen([sys.executable, '-m', 'tvm_tcutils', 'count-layers', 'resnet-50'],"
            " stdout=w, stderr=subprocess.PIPE)\n"
            "os.close(w); f = os.fdopen(r, 'rb'); f.readline(); f.close()\n"
            "err = p.stderr.read().decode(); print(p.wait()); print('Traceback' in err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr


def test_count_layers_tvm_numbering(capsys):
    from tvm_tcutils.cli import main

    assert main(["count-layers", "resnet-18", "--numbering", "tvm"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert [int(row[0]) for row in rows][:6] == [0, 1, 2, 2, 3, 4]  # a shortcut conv shares TVM's index 2
    assert len(rows) == 21


# Under -m slow (the CI budget, 11 s): dotprod/test_hexagon_profile.py builds and profiles the same kind of
# quantized MLP bit-exactly with its counts added up (test_both_builds_bit_exact_and_counts_add_up); the
# CLI's --emulate and --per-node arguments are checked in test_cli_errors.py.
@pytest.mark.slow
def test_bench_emulate_profiles_hexagon_bit_exactly(tmp_path):
    from tvm_tcutils.dotprod import hexagon_profile

    if hexagon_profile.missing_profile_tools():
        pytest.skip(f"needs {hexagon_profile.missing_profile_tools()} (scripts/test.sh installs them)")
    proc = run_cli("bench", "mlp", "--target", "hexagon", "--emulate", "--per-node", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "quantize_int8" in out and "final softmax stripped" in out
    total = next(line.split() for line in out.splitlines() if line.startswith("total"))
    # MACs, packets, instructions, vrmpy, ideal vrmpy, plain packets, plain instructions
    macs, packets, _, vrmpy, ideal, plain_packets, _ = map(int, total[1:])
    assert macs == 784 * 128 + 128 * 64 + 64 * 10 and ideal == -(-macs // 128)
    assert ideal <= vrmpy < 1.1 * ideal and 2 * packets < plain_packets
    assert "bit-identical to the x86 build and to the plain build" in " ".join(out.split())
    # The per-node run: one line, every 8-bit boundary and output equal.
    per_node = next(line for line in out.splitlines() if line.startswith("per node (auto, "))
    assert "Hexagon and x86 agree bit for bit on the outputs and on all" in per_node
    assert os.listdir(tmp_path) == []


def test_collage_cli_measures_with_the_librarys_default_workers(monkeypatch):
    # The CLI had its own default of one measuring worker: half the library's on 2 CPUs (DenseNet-121's
    # search 430 s against 191-294 s). Unset, it leaves the choice to MeasuredCostEstimator (auto_workers).
    import argparse

    from tvm_tcutils.collage.cost import measured
    from tvm_tcutils.commands import collage

    parser = argparse.ArgumentParser()
    collage.add_arguments(parser)
    seen = {}

    class Stop(Exception):
        pass

    def stop(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(measured, "MeasuredCostEstimator", stop)
    for argv, workers in ((["mlp", "--toolchains", "tvm"], None), (["mlp", "--toolchains", "tvm", "--workers", "3"], 3)):
        with pytest.raises(Stop):
            collage.run(parser.parse_args(argv))
        assert seen["workers"] == workers
