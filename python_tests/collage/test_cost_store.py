"""The persistent cost store: damaged records, unusable paths, concurrent appends, failures measured again."""
from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import time

import pytest

from tvm_tcutils.collage.cost.store import SCHEMA, CostStore, parse_record

GOOD = {"v": SCHEMA, "key": "good", "ms": 1.5, "toolchain": "tvm", "ops": ["add"], "error": None}


def _write(directory, lines):
    path = os.path.join(directory, CostStore.FILE)
    with open(path, "wb") as handle:
        handle.write(b"".join(lines))
    return path


DAMAGE = {
    "cut in the middle": b'{"v": 1, "key": "cut", "ms": 2.',
    "not UTF-8": b'{"v": 1, "key": "\xff\xfe", "ms": 2.0}',
    "a JSON list": b'[1, 2, 3]',
    "a JSON number": b'42',
    "no key": b'{"v": 1, "ms": 2.0}',
    "key not a string": b'{"v": 1, "key": 7, "ms": 2.0}',
    "ms a string": b'{"v": 1, "key": "s", "ms": "fast"}',
    "ms a bool": b'{"v": 1, "key": "b", "ms": true}',
    "ops not a list": b'{"v": 1, "key": "o", "ms": 1.0, "ops": "add"}',
    "version not a number": b'{"v": "one", "key": "x", "ms": 1.0}',
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_line_is_skipped_with_one_warning_naming_file_and_line(tmp_path, caplog, kind):
    path = _write(str(tmp_path), [json.dumps(GOOD).encode() + b"\n", DAMAGE[kind] + b"\n",
                                  json.dumps(dict(GOOD, key="after")).encode() + b"\n"])
    with caplog.at_level(logging.WARNING, logger="tvm_tcutils.collage"):
        store = CostStore(str(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and path in warnings[0] and "line 2" in warnings[0], warnings
    assert store.get("good")["ms"] == 1.5 and store.get("after")["ms"] == 1.5 and store.loaded == 2
    assert [n for n, _ in store.skipped] == [2]


def test_parse_record_names_what_is_wrong():
    assert parse_record(json.dumps(GOOD).encode()) == (GOOD, "")
    assert parse_record(b"\xff")[1] == "not UTF-8"
    assert parse_record(b"[]")[1] == "a JSON list, not an object"


def test_a_cut_last_line_does_not_swallow_the_next_record(tmp_path):
    _write(str(tmp_path), [json.dumps(GOOD).encode() + b"\n", DAMAGE["cut in the middle"]])
    CostStore(str(tmp_path)).put("new", {"ms": 3.0})
    again = CostStore(str(tmp_path))
    assert again.get("new")["ms"] == 3.0 and again.get("good") is not None and len(again.skipped) == 1


def test_records_of_older_and_newer_schemas(tmp_path):
    legacy = {"key": "legacy", "ms": 1.0, "toolchain": "tvm", "ops": []}  # before versions: read
    newer = dict(GOOD, key="newer", v=SCHEMA + 1)  # a newer release's: left alone
    _write(str(tmp_path), [json.dumps(legacy).encode() + b"\n", json.dumps(newer).encode() + b"\n"])
    store = CostStore(str(tmp_path))
    assert store.get("legacy")["ms"] == 1.0 and store.get("newer") is None and not store.skipped


def _unreadable_file(tmp_path):
    os.makedirs(tmp_path / "cache" / CostStore.FILE)  # a directory where the file should be
    return str(tmp_path / "cache")


def _directory_is_a_file(tmp_path):
    (tmp_path / "cache").write_text("")  # a file where the directory should be
    return str(tmp_path / "cache")


@pytest.mark.parametrize("make", [_unreadable_file, _directory_is_a_file])
def test_an_unusable_path_degrades_to_memory_with_a_warning(tmp_path, caplog, make):
    directory = make(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tvm_tcutils.collage"):
        store = CostStore(directory)
        store.put("k", {"ms": 2.0})
        store.put("j", {"ms": 3.0})
    assert store.path is None and store.get("k")["ms"] == 2.0 and store.get("j")["ms"] == 3.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "kept in memory" in warnings[0]


def test_no_permission_degrades_to_memory(tmp_path, monkeypatch):
    path = _write(str(tmp_path), [json.dumps(GOOD).encode() + b"\n"])
    # CI runs as root, which reads and writes whatever the mode bits say: the refusal is simulated.
    from tvm_tcutils.collage.cost import store as store_module

    def refused(name, *args, **kwargs):
        if os.fspath(name) == path:
            raise PermissionError(13, "Permission denied", name)
        return real_open(name, *args, **kwargs)

    def refused_fd(name, *args, **kwargs):
        if os.fspath(name) == path:
            raise PermissionError(13, "Permission denied", name)
        return real_os_open(name, *args, **kwargs)

    real_open, real_os_open = open, os.open
    monkeypatch.setattr(store_module, "open", refused, raising=False)
    monkeypatch.setattr(os, "open", refused_fd)
    store = CostStore(str(tmp_path))
    store.put("k", {"ms": 2.0})
    monkeypatch.undo()
    assert store.path is None and store.get("k")["ms"] == 2.0


def _append_many(directory, name):
    store = CostStore(directory)
    for k in range(200):
        store.put(f"{name}{k}", {"ms": 1.0, "toolchain": "tvm", "ops": ["x" * 300] * 20})


def test_two_processes_appending_never_interleave_records(tmp_path):
    context = multiprocessing.get_context("fork")  # the children only write files
    workers = [context.Process(target=_append_many, args=(str(tmp_path), name)) for name in "ab"]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    store = CostStore(str(tmp_path))
    assert not store.skipped and len(store.entries) == 400


def test_failures_are_measured_again_when_old_or_asked(tmp_path):
    store = CostStore(str(tmp_path), failure_ttl=3600)
    store.put("fresh", {"ms": math.inf, "error": "boom"})
    store.put("stale", {"ms": None, "error": "boom", "time": time.time() - 7200})
    store.put("fine", {"ms": 1.0})
    reread = CostStore(str(tmp_path), failure_ttl=3600)
    assert reread.get("fresh")["error"] == "boom" and reread.get("fresh")["ms"] is None
    assert reread.get("stale") is None and reread.get("fine")["ms"] == 1.0
    retry = CostStore(str(tmp_path), retry_failed=True)
    assert retry.get("fresh") is None and retry.get("fine")["ms"] == 1.0
    with pytest.raises(ValueError, match="failure_ttl"):
        CostStore(None, failure_ttl=-1)
