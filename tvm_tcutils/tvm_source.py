"""TVM's source headers for the CUDA plugin, from TVM's public release archive when nothing local has them.

The PyPI TVM wheel ships its runtime headers only; the CUDA plugin (``cmake/cuda``)
compiles against the compiler's headers of the *same* TVM version. Where no source
tree (``TVM_SOURCE_DIR``) or archive (``TVM_SOURCE_ARCHIVE``, the project's copy) is
at hand, ``scripts/build_native.sh`` asks this module, which downloads the version's
Apache release archive from its public address, checks it against the SHA-256
pinned in :data:`RELEASES` before anything reads it, keeps it in the package's
cache folder and unpacks its headers. Offline, it says in one line what to set.

Examples
--------
>>> RELEASES["0.19.0"].file_name
'apache-tvm-src-v0.19.0.tar.gz'
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
from typing import Dict, List, NamedTuple, Optional, Sequence

from .files import atomic_path, cache_dir, write_atomically

logger = logging.getLogger(__name__)


class Release(NamedTuple):
    """One TVM version's source release: where it is published and the SHA-256 of the archive."""

    urls: Sequence[str]
    sha256: str

    @property
    def file_name(self) -> str:
        return self.urls[0].rsplit("/", 1)[1]


#: TVM source releases by version. The checksum is that of the Apache release archive (as Spack's
#: ``tvm`` package pins it); the GitHub release asset and the Apache archive serve the same file.
RELEASES: Dict[str, Release] = {
    "0.19.0": Release(
        ("https://github.com/apache/tvm/releases/download/v0.19.0/apache-tvm-src-v0.19.0.tar.gz",
         "https://archive.apache.org/dist/tvm/tvm-v0.19.0/apache-tvm-src-v0.19.0.tar.gz"),
        "13fd707eae37b9b2b77bccd39668764f61ae6824d50cd1ab8164df1c75565be1"),
}

#: Environment variable that replaces the release's addresses (a mirror, or a ``file://`` URL offline).
URL_ENV = "TCUTILS_TVM_SOURCE_URL"

#: The folders of a source tree the CUDA plugin compiles against (its CMakeLists' include paths).
HEADER_DIRS = ("include", "3rdparty/dlpack/include", "3rdparty/dmlc-core/include")

#: A file every usable tree has (what ``build_native.sh`` checks).
MARKER = "include/tvm/ir/module.h"

#: Written into an unpacked tree: the archive's SHA-256 (part of ``build_native.sh``'s build cache key).
DIGEST_FILE = ".tcutils-archive-sha256"

#: Written into ``dest`` when a download failed: later builds do not wait on the network again for a day.
FAILED_FILE = ".download-failed"
RETRY_AFTER_S = 24 * 3600

_CHUNK = 1 << 20


def release(version: str) -> Release:
    """The pinned release of ``version``.

    Raises
    ------
    ValueError
        For a version with no pinned release, naming those there are.

    Examples
    --------
    >>> release("0.19.0").sha256[:12]
    '13fd707eae37'
    >>> release("0.18.0")
    Traceback (most recent call last):
    ...
    ValueError: version: no pinned TVM source release for '0.18.0' (pinned: 0.19.0); set TVM_SOURCE_DIR...
    """
    if version not in RELEASES:
        raise ValueError(f"version: no pinned TVM source release for {version!r} (pinned: {', '.join(RELEASES)}); "
                         "set TVM_SOURCE_DIR to a source tree of that version")
    return RELEASES[version]


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file, read in chunks.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(delete=False) as handle:
    ...     _ = handle.write(b"abc")
    >>> file_sha256(handle.name)[:16]
    'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_archive(version: str, folder: Optional[str] = None, urls: Optional[Sequence[str]] = None,
                  sha256: Optional[str] = None, timeout: float = 30.0) -> str:
    """The release archive of ``version`` in ``folder``, downloaded once and checked against its SHA-256.

    A kept archive is checked again before use; one that does not match (a
    damaged download, a changed file) is removed with a warning naming it and
    downloaded anew. A download goes to a temporary file in ``folder`` and
    replaces the archive only once its checksum matches, so an interrupted or
    wrong download leaves nothing behind.

    Parameters
    ----------
    version : str
        A key of :data:`RELEASES`.
    folder : str, optional
        Where archives are kept (default: ``tvm-src`` in the package's cache folder).
    urls : sequence of str, optional
        Tried in order (default: ``$TCUTILS_TVM_SOURCE_URL``, else the release's).
    sha256 : str, optional
        Expected checksum (default: the pinned one).
    timeout : float
        Seconds a connection may stay silent.

    Raises
    ------
    ValueError
        For an unpinned version, or when what was downloaded does not match the checksum.
    OSError
        When no address could be read (offline), naming each and why.

    Examples
    --------
    >>> import io, pathlib, tempfile
    >>> src = pathlib.Path(tempfile.mkdtemp(), "a.tar.gz"); src.write_bytes(b"not the release")
    15
    >>> fetch_archive("0.19.0", tempfile.mkdtemp(), urls=[src.as_uri()])
    Traceback (most recent call last):
    ...
    ValueError: the TVM 0.19.0 source archive from file:///... has SHA-256 7df2fd503649..., not the pinned 13fd...
    """
    pinned = release(version)
    expected = (sha256 or pinned.sha256).lower()
    folder = folder or cache_dir("tvm-src")
    if urls is None:
        urls = [os.environ[URL_ENV]] if os.environ.get(URL_ENV) else list(pinned.urls)
    path = os.path.join(folder, pinned.file_name)
    if os.path.isfile(path):
        if file_sha256(path) == expected:
            return path
        logger.warning("%s does not match the pinned SHA-256 of TVM %s's source: removed, downloading again",
                       path, version)
        os.unlink(path)
    os.makedirs(folder, exist_ok=True)
    failures: List[str] = []
    for url in urls:
        try:
            with atomic_path(path) as partial:
                with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
                    shutil.copyfileobj(response, out, _CHUNK)
                got = file_sha256(partial)
                if got != expected:
                    raise ValueError(
                        f"the TVM {version} source archive from {url} has SHA-256 {got[:12]}..., not the pinned "
                        f"{expected[:12]}...: not used (a damaged download or a changed file)")
            return path
        except (urllib.error.URLError, OSError) as err:
            failures.append(f"{url}: {getattr(err, 'reason', None) or err}")
    raise OSError(f"could not download TVM {version}'s source ({'; '.join(failures)})")


def _tree_root(names: Sequence[str], archive: str) -> str:
    """The member prefix under which the archive holds a source tree (``tvm/``, ``apache-tvm-src-v.../``)."""
    for name in names:
        if name.endswith("/" + MARKER) or name == MARKER:
            return name[: len(name) - len(MARKER)]
    raise ValueError(f"archive: {archive} holds no TVM source tree (no {MARKER} in it)")


def extract_headers(archive: str, dest: str) -> str:
    """Unpack the header folders (:data:`HEADER_DIRS`) of a TVM source archive into ``dest/tvm``.

    Any top folder name is accepted (the project's ``tvm/``, the release's
    ``apache-tvm-src-v<version>/``); folders the archive lacks (a release
    without its submodules) are left out, the wheel's own copies stand in.
    The tree is unpacked beside ``dest/tvm`` and renamed into place whole, and
    members are unpacked with tarfile's ``data`` filter (no links out of the
    tree, no absolute paths).

    Returns
    -------
    str
        ``dest/tvm``, the source root to give CMake as ``TVM_SOURCE_DIR``.

    Raises
    ------
    ValueError
        When ``archive`` is not a readable tar archive, holds no TVM tree, or
        has a header that would be unpacked outside it (links are skipped).

    Examples
    --------
    >>> import io, os, tarfile, tempfile
    >>> archive = os.path.join(tempfile.mkdtemp(), "src.tar.gz")
    >>> with tarfile.open(archive, "w:gz") as tar:
    ...     info = tarfile.TarInfo("apache-tvm-src-v0.19.0/include/tvm/ir/module.h"); info.size = 2
    ...     tar.addfile(info, io.BytesIO(b"//"))
    >>> root = extract_headers(archive, tempfile.mkdtemp())
    >>> os.path.isfile(os.path.join(root, "include/tvm/ir/module.h"))
    True
    """
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            prefix = _tree_root([m.name for m in members], archive)
            wanted = tuple(prefix + folder + "/" for folder in HEADER_DIRS)
            chosen = []
            for member in members:
                if member.name.startswith(wanted) and (member.isfile() or member.isdir()):
                    member.name = "tvm/" + member.name[len(prefix):]
                    chosen.append(member)
            os.makedirs(dest, exist_ok=True)
            staging = os.path.join(dest, f".tvm-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            try:
                tar.extractall(staging, members=chosen, filter="data")
                with open(os.path.join(staging, "tvm", DIGEST_FILE), "w") as out:
                    out.write(file_sha256(archive) + "\n")
                root = os.path.join(dest, "tvm")
                shutil.rmtree(root, ignore_errors=True)
                os.replace(os.path.join(staging, "tvm"), root)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except tarfile.FilterError as err:
        raise ValueError(f"archive: {archive} has a member that would land outside its tree ({err}): not used") \
            from None
    except (tarfile.TarError, EOFError) as err:
        raise ValueError(f"archive: {archive} is not a readable tar archive ({err})") from None
    return root


def headers(version: str, dest: str, archive: Optional[str] = None, timeout: float = 30.0) -> str:
    """A source root for ``version``'s headers under ``dest``: from ``archive``, else the fetched release.

    Examples
    --------
    >>> headers("0.18.0", "/tmp")
    Traceback (most recent call last):
    ...
    ValueError: version: no pinned TVM source release for '0.18.0' (pinned: 0.19.0); set TVM_SOURCE_DIR...
    """
    if archive is None:
        archive = fetch_archive(version, timeout=timeout)
    elif not os.path.isfile(archive):
        raise ValueError(f"archive: {archive} is not a file")
    return extract_headers(archive, dest)


def _recent_failure(dest: str) -> Optional[str]:
    """Why the last download into ``dest`` failed, if it did less than :data:`RETRY_AFTER_S` ago."""
    path = os.path.join(dest, FAILED_FILE)
    try:
        if time.time() - os.path.getmtime(path) < RETRY_AFTER_S:
            with open(path) as handle:
                return f"{handle.read().strip()} (remembered in {path}: delete it to try again now)"
    except OSError:
        pass
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tvm_tcutils.tvm_source VERSION DEST [--archive FILE]``: print the source root, or one note.

    The exit status is 1 with a ``note:`` line on stderr when no headers could
    be had. A failed download is remembered in ``DEST`` for a day (unless
    ``$TCUTILS_TVM_SOURCE_URL`` names an address), so that an offline machine
    does not wait on the network at every build.
    """
    parser = argparse.ArgumentParser(prog="python -m tvm_tcutils.tvm_source", description=main.__doc__)
    parser.add_argument("version")
    parser.add_argument("dest")
    parser.add_argument("--archive", help="a TVM source archive to unpack instead of the fetched release")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a connection may stay silent")
    args = parser.parse_args(argv)
    logging.basicConfig(format="warning: %(message)s", level=logging.WARNING)
    remembered = None if args.archive or os.environ.get(URL_ENV) else _recent_failure(args.dest)
    try:
        if remembered:
            raise OSError(remembered)
        print(headers(args.version, args.dest, args.archive, args.timeout))
    except (ValueError, OSError) as err:
        if remembered is None and args.archive is None:
            os.makedirs(args.dest, exist_ok=True)
            write_atomically(os.path.join(args.dest, FAILED_FILE), f"{err}\n".encode())
        print(f"note: no TVM {args.version} source headers: {err}; the CUDA plugin is not built "
              "(set TVM_SOURCE_DIR to a source tree or TVM_SOURCE_ARCHIVE to its release archive)", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(args.dest, FAILED_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
