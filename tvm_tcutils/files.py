"""Files written whole or not at all: a reader (another process, a later run) never sees half of one.

Every file the package writes for later (saved models and their ``.params``,
benchmark JSON, quantized ONNX models, the weights shared with measuring
workers) goes through :func:`atomic_path`: the writer fills a temporary file in
the target's folder, which then replaces the target in one ``os.replace``. An
interrupted or failed write leaves the previous file as it was, and no
temporary file behind.

Examples
--------
>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> path = write_atomically(os.path.join(folder, "a.txt"), b"hello")
>>> open(path, "rb").read(), os.listdir(folder)
(b'hello', ['a.txt'])
"""
from __future__ import annotations

import contextlib
import os
import uuid
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = "") -> Iterator[str]:
    """A temporary path next to ``path`` to write to; on leaving the block it replaces ``path``.

    ``suffix`` is the temporary file's ending, for writers that choose the
    format by it (``np.save`` adds ``.npy`` to a name without it). If the
    block raises (or is interrupted), ``path`` is untouched and the temporary
    file removed.

    Examples
    --------
    >>> import os, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "x.json")
    >>> try:
    ...     with atomic_path(target) as partial:
    ...         _ = open(partial, "w").write("half")
    ...         raise KeyboardInterrupt
    ... except KeyboardInterrupt:
    ...     pass
    >>> os.listdir(os.path.dirname(target))
    []
    """
    folder = os.path.dirname(os.path.abspath(path))
    # A fresh name, not a file made by mkstemp: the writer creates it with the user's usual
    # permissions (mkstemp's are 0600, which a saved model shared with others should not get).
    partial = os.path.join(folder, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}{suffix}")
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise


def write_atomically(path: str, data: bytes) -> str:
    """Write ``data`` to ``path`` through :func:`atomic_path`; returns ``path``.

    Examples
    --------
    >>> import os, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "b.bin")
    >>> open(write_atomically(target, b"\\x00\\x01"), "rb").read()
    b'\\x00\\x01'
    """
    with atomic_path(path) as partial:
        with open(partial, "wb") as out:
            out.write(data)
    return path


def can_create_in(folder: str) -> bool:
    """Whether a file can be created in the existing ``folder``: tried, not guessed from permission bits.

    ``os.access`` answers from the mode bits, and for root it says yes to
    folders no file can be made in (``/proc``, a read-only bind mount seen
    through some kernels); a probe file, created exclusively and removed at
    once, gives the answer the later write will get.

    Examples
    --------
    >>> import tempfile
    >>> can_create_in(tempfile.mkdtemp()), can_create_in("/proc")
    (True, False)
    """
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        return False
    probe = os.path.join(folder, f".tmp-probe-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


def cache_dir(name: str) -> str:
    """``name`` under the package's cache folder: ``$TVM_TCUTILS_CACHE``, else ``~/.cache/tvm-tcutils``.

    The folder is not created here; each cache makes its own when it first writes.

    Examples
    --------
    >>> os.path.basename(cache_dir("int8"))
    'int8'
    """
    root = os.environ.get("TVM_TCUTILS_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "tvm-tcutils"))
    return os.path.join(root, name)
