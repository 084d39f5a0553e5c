"""Saved models: atomic writes, params fingerprints, stale and foreign .params refused (issue 20)."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import tvm
from tvm import relay

from tvm_tcutils.models import ModelError, check_output_path, load_model, params_fingerprint, save_model


@pytest.fixture(scope="module")
def mlp():
    return load_model("mlp")


def _other_params(params):
    return {name: tvm.nd.array(value.numpy() + 1) for name, value in params.items()}


@pytest.mark.parametrize("ext", [".json", ".relay"])
def test_round_trip_records_and_checks_the_fingerprint(mlp, tmp_path, ext):
    mod, params = mlp
    path = str(tmp_path / f"m{ext}")
    save_model(path, mod, params)
    loaded, loaded_params = load_model(path)
    assert tvm.ir.structural_equal(loaded, mod)
    assert params_fingerprint(loaded_params) == params_fingerprint(params)
    assert sorted(os.listdir(tmp_path)) == sorted([f"m{ext}", "m.params"])  # no temporary files left


@pytest.mark.parametrize("ext", [".json", ".relay"])
def test_params_of_an_older_save_are_refused_naming_both_files(mlp, tmp_path, ext):
    mod, params = mlp
    path = str(tmp_path / f"m{ext}")
    save_model(path, mod, params)
    shutil.copy(tmp_path / "m.params", tmp_path / "old.params")
    save_model(path, mod, _other_params(params))
    shutil.copy(tmp_path / "old.params", tmp_path / "m.params")
    with pytest.raises(ModelError) as err:
        load_model(path)
    assert str(tmp_path / "m.params") in str(err.value) and path in str(err.value)


def test_params_of_another_model_are_refused(mlp, tmp_path):
    mod, params = mlp
    save_model(str(tmp_path / "a.json"), mod, params)
    x = relay.var("data", shape=(1, 4))
    w = relay.var("w", shape=(2, 4))
    other = tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.dense(x, w)))
    save_model(str(tmp_path / "b.json"), other, {"w": np.ones((2, 4), "float32")})
    shutil.copy(tmp_path / "b.params", tmp_path / "a.params")
    with pytest.raises(ModelError, match="does not belong to"):
        load_model(str(tmp_path / "a.json"))


def test_saving_without_params_removes_a_stale_params_file(mlp, tmp_path):
    mod, params = mlp
    path = str(tmp_path / "m.json")
    save_model(path, mod, params)
    save_model(path, mod)
    assert not os.path.exists(tmp_path / "m.params")
    loaded, loaded_params = load_model(path)
    assert loaded_params == {}


def test_missing_params_of_a_graph_saved_with_them_is_an_error(mlp, tmp_path):
    mod, params = mlp
    path = str(tmp_path / "m.json")
    save_model(path, mod, params)
    os.unlink(tmp_path / "m.params")
    with pytest.raises(ModelError, match="m.params is missing"):
        load_model(path)


def test_graphs_saved_without_a_fingerprint_still_load(mlp, tmp_path):
    mod, params = mlp
    path = tmp_path / "plain.json"
    path.write_text(tvm.ir.save_json(mod))
    (tmp_path / "plain.params").write_bytes(relay.save_param_dict(params))
    loaded, loaded_params = load_model(str(path))
    assert sorted(loaded_params) == sorted(params)
    assert "tcutils_params" not in json.loads(path.read_text())["attrs"]


@pytest.mark.parametrize("mod, params, error", [
    (None, None, TypeError),
    ("def @main() { 0 }", None, TypeError),
    ("module", [1, 2], TypeError),
])
def test_bad_arguments_are_refused_before_writing(mlp, tmp_path, mod, params, error):
    mod = mlp[0] if mod == "module" else mod
    with pytest.raises(error):
        save_model(str(tmp_path / "m.json"), mod, params)
    assert os.listdir(tmp_path) == []


def test_overwrite_false_refuses_an_existing_model(mlp, tmp_path):
    mod, params = mlp
    path = str(tmp_path / "m.json")
    save_model(path, mod, params)
    before = (tmp_path / "m.json").read_bytes()
    with pytest.raises(ModelError, match="already exist"):
        save_model(path, mod, _other_params(params), overwrite=False)
    assert (tmp_path / "m.json").read_bytes() == before


@pytest.mark.parametrize("path, message", [
    ("{tmp}/missing/m.json", "does not exist"),
    ("{tmp}/m.onnx", "cannot save as '.onnx'"),
])
def test_output_paths_are_checked_up_front(tmp_path, path, message):
    with pytest.raises(ModelError, match=message):
        check_output_path(path.format(tmp=tmp_path), argument="-o")


def test_unwritable_directory_is_refused(tmp_path, monkeypatch):
    # Root (CI) may write anywhere, so the permission answer is simulated.
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK)
    with pytest.raises(ModelError, match="not writable"):
        check_output_path(str(tmp_path / "m.json"))
