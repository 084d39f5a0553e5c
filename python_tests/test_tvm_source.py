"""TVM's source headers for the CUDA plugin: the pinned release downloaded, checked and unpacked, offline too.

Every download here reads a ``file://`` URL: no test touches the network.
"""
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import ROOT
from tvm_tcutils import tvm_source

#: What an archive's tree must hold, and one file from each header folder.
_HEADERS = {
    "include/tvm/ir/module.h": b"// module\n",
    "3rdparty/dlpack/include/dlpack/dlpack.h": b"// dlpack\n",
    "3rdparty/dmlc-core/include/dmlc/logging.h": b"// dmlc\n",
}
#: Files of a source tree the plugin does not need: never unpacked.
_OTHERS = {"src/target/codegen.cc": b"int x;\n", "python/tvm/__init__.py": b"\n"}


def _archive(path, top: str, files: dict, mode: str = "w:gz", extra=()) -> str:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return str(path)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def release(tmp_path, monkeypatch):
    """A pinned release ``9.9.9`` whose only address is a local file (the archive, in apache's layout)."""
    served = tmp_path / "served"
    served.mkdir()
    archive = _archive(served / "apache-tvm-src-v9.9.9.tar.gz", "apache-tvm-src-v9.9.9", {**_HEADERS, **_OTHERS})
    url = (served / "apache-tvm-src-v9.9.9.tar.gz").as_uri()
    monkeypatch.setitem(tvm_source.RELEASES, "9.9.9", tvm_source.Release((url,), _sha(archive)))
    monkeypatch.delenv(tvm_source.URL_ENV, raising=False)
    return archive


def test_the_pinned_release_of_the_installed_tvm_is_known():
    import tvm

    version = tvm.__version__.split(".dev")[0]
    pinned = tvm_source.release(version)
    assert len(pinned.sha256) == 64 and all(url.startswith("https://") for url in pinned.urls)
    assert all(url.endswith("/" + pinned.file_name) for url in pinned.urls)


def test_an_unpinned_version_names_the_pinned_ones():
    with pytest.raises(ValueError, match=r"version: .*'0\.1\.0'.*pinned: 0\.19\.0"):
        tvm_source.release("0.1.0")


def test_a_download_is_checked_kept_and_reused(release, tmp_path):
    folder = tmp_path / "cache"
    path = tvm_source.fetch_archive("9.9.9", str(folder))
    assert os.path.basename(path) == "apache-tvm-src-v9.9.9.tar.gz"
    assert _sha(path) == _sha(release)
    assert os.listdir(folder) == ["apache-tvm-src-v9.9.9.tar.gz"]
    os.unlink(release)  # the address is gone: the kept copy is used
    assert tvm_source.fetch_archive("9.9.9", str(folder)) == path


def test_a_damaged_kept_archive_is_named_and_downloaded_again(release, tmp_path, caplog):
    folder = tmp_path / "cache"
    path = tvm_source.fetch_archive("9.9.9", str(folder))
    with open(path, "r+b") as handle:
        handle.truncate(100)
    with caplog.at_level(logging.WARNING, logger="tvm_tcutils.tvm_source"):
        again = tvm_source.fetch_archive("9.9.9", str(folder))
    assert path in caplog.text and "SHA-256" in caplog.text
    assert again == path and _sha(path) == _sha(release)


def test_a_download_that_does_not_match_the_pin_is_refused_and_not_kept(release, tmp_path):
    folder = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"SHA-256 [0-9a-f]{12}\.\.\., not the pinned 000000000000"):
        tvm_source.fetch_archive("9.9.9", str(folder), sha256="0" * 64)
    assert os.listdir(folder) == []  # neither the archive nor a partial download


def test_offline_every_address_is_named_with_why(tmp_path):
    missing = [(tmp_path / name).as_uri() for name in ("a.tar.gz", "b.tar.gz")]
    with pytest.raises(OSError, match=r"could not download TVM 0\.19\.0's source \(file:.*a\.tar\.gz: .*b\.tar\.gz"):
        tvm_source.fetch_archive("0.19.0", str(tmp_path / "cache"), urls=missing)


@pytest.mark.parametrize("top", ["apache-tvm-src-v0.19.0", "tvm", ""])
@pytest.mark.parametrize("mode", ["w:gz", "w:xz"])
def test_only_the_header_folders_are_unpacked_from_any_layout(tmp_path, top, mode):
    archive = _archive(tmp_path / "src.tar", top, {**_HEADERS, **_OTHERS}, mode)
    root = tvm_source.extract_headers(archive, str(tmp_path / "out"))
    assert root == str(tmp_path / "out" / "tvm")
    found = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    assert found == sorted([*_HEADERS, tvm_source.DIGEST_FILE])
    assert open(os.path.join(root, tvm_source.DIGEST_FILE)).read().strip() == _sha(archive)
    assert os.listdir(tmp_path / "out") == ["tvm"]  # no staging folder left


def test_a_release_without_its_submodules_gives_the_include_folder(tmp_path):
    archive = _archive(tmp_path / "src.tar.gz", "apache-tvm-src-v0.19.0", {"include/tvm/ir/module.h": b"//"})
    root = tvm_source.extract_headers(archive, str(tmp_path / "out"))
    assert os.path.isfile(os.path.join(root, "include/tvm/ir/module.h"))
    assert not os.path.exists(os.path.join(root, "3rdparty"))


def test_links_are_skipped_and_a_path_out_of_the_tree_refuses_the_archive(tmp_path):
    link = tarfile.TarInfo("tvm/include/tvm/evil.h")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    root = tvm_source.extract_headers(_archive(tmp_path / "a.tar.gz", "tvm", _HEADERS, extra=[link]),
                                      str(tmp_path / "out"))
    assert not os.path.lexists(os.path.join(root, "include/tvm/evil.h"))
    escape = tarfile.TarInfo("tvm/include/../../../outside.h")
    archive = _archive(tmp_path / "b.tar.gz", "tvm", _HEADERS, extra=[escape])
    with pytest.raises(ValueError, match=r"b\.tar\.gz has a member that would land outside its tree"):
        tvm_source.extract_headers(archive, str(tmp_path / "out2"))
    assert not list(tmp_path.rglob("outside.h")) and not (tmp_path / "out2" / "tvm").exists()


@pytest.mark.parametrize("content,match", [
    (b"this is no archive", "is not a readable tar archive"),
    (None, r"holds no TVM source tree \(no include/tvm/ir/module\.h"),
])
def test_a_bad_archive_is_named(tmp_path, content, match):
    path = tmp_path / "bad.tar.gz"
    if content is None:
        _archive(path, "tvm", _OTHERS)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"archive: {path} .*{match}"):
        tvm_source.extract_headers(str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "tvm").exists()


def test_main_unpacks_the_fetched_release(release, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TVM_TCUTILS_CACHE", str(tmp_path / "cache"))
    assert tvm_source.main(["9.9.9", str(tmp_path / "build")]) == 0
    root = capsys.readouterr().out.strip()
    assert root == str(tmp_path / "build" / "tvm") and os.path.isfile(os.path.join(root, tvm_source.MARKER))


def test_main_offline_says_what_to_set_once_and_remembers_for_a_day(release, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TVM_TCUTILS_CACHE", str(tmp_path / "cache"))
    served = release + ".moved"
    shutil.move(release, served)
    dest = str(tmp_path / "build")
    assert tvm_source.main(["9.9.9", dest]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("note: no TVM 9.9.9 source headers: could not download")
    assert "TVM_SOURCE_DIR" in err and "TVM_SOURCE_ARCHIVE" in err
    # Back online: within the day the failure is remembered (no wait on the network at every build) ...
    shutil.move(served, release)
    assert tvm_source.main(["9.9.9", dest]) == 1
    assert "delete it to try again" in capsys.readouterr().err
    # ... unless an address is named, which tries again and forgets the failure.
    monkeypatch.setenv(tvm_source.URL_ENV, tvm_source.RELEASES["9.9.9"].urls[0])
    assert tvm_source.main(["9.9.9", dest]) == 0
    assert os.listdir(dest) == ["tvm"]


def test_build_native_fetches_and_refuses_an_archive_that_is_not_the_pinned_release(tmp_path):
    """The build script offline with a local file URL: the project's own archive is not the Apache release."""
    from tvm_tcutils import cuda

    import tvm

    if not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))):
        pytest.skip("native helpers need cmake and a C++ compiler, not found")
    if cuda.toolkit_root() is None:
        pytest.skip("no CUDA toolkit: build_native.sh never looks for TVM's headers")
    if not os.path.isfile(os.path.join(os.path.dirname(tvm.__file__), "src/target/opt/build_cuda_on.cc")):
        pytest.skip("the installed TVM ships no CUDA sources: build_native.sh never looks for TVM's headers")
    other = _archive(tmp_path / "other.tar.gz", "tvm", _HEADERS)
    env = {**os.environ, "TCUTILS_NATIVE_BUILD": str(tmp_path / "build"), "TVM_TCUTILS_CACHE": str(tmp_path / "c"),
           "TVM_SOURCE_ARCHIVE": str(tmp_path / "none.tar.xz"), tvm_source.URL_ENV: f"file://{other}"}
    env.pop("TVM_SOURCE_DIR", None)
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_native.sh"), sys.executable],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert [os.path.basename(p) for p in done.stdout.split()] == ["libtvm_tcutils_native.so"]
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "not the pinned 13fd707eae37" in notes[0] and "not built" in notes[0], notes
    assert not os.path.exists(tmp_path / "c" / "tvm-src" / "apache-tvm-src-v0.19.0.tar.gz")
