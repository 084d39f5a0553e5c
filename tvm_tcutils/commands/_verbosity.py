"""How much a command prints on stderr: ``--quiet`` (errors only), the default, ``-v`` (TVM's own warnings too).

By default the noise of the libraries under the package is hidden: AutoTVM's
"Cannot find config ... fallback configuration" and "not been tuned" warnings,
setuptools / ``pkg_resources`` deprecation banners, and the warnings TVM's C++
code writes straight to the process's stderr (``ConvertLayout``'s "Desired
layout(s) not specified", "Unable to detect CUDA version"...). TVM 0.19 has no
switch for the level of its C++ log (``TVM_LOG_DEBUG`` only turns on more), so
those lines are filtered out of file descriptor 2 by :class:`NativeLogFilter`;
everything else on it (errors, other programs' output) passes through.

Examples
--------
>>> sorted(LEVELS)
['default', 'quiet', 'verbose']
>>> with verbosity("quiet"):
...     logging.getLogger("tvm_tcutils").getEffectiveLevel() == logging.ERROR
True
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import subprocess
import sys
import warnings
from typing import Iterator, Optional


@dataclasses.dataclass(frozen=True)
class Level:
    """What one verbosity shows.

    Parameters
    ----------
    package : int
        Level of the package's loggers (``tvm_tcutils.*``).
    tvm : int
        Level of TVM's Python loggers (:data:`TVM_LOGGERS`).
    native : bool
        Whether TVM's C++ info and warning lines reach stderr.
    python_warnings : str or None
        ``warnings`` action for every warning; None keeps Python's defaults (library
        banners are ignored below ``verbose`` all the same).
    """

    package: int
    tvm: int
    native: bool
    python_warnings: Optional[str]


#: Verbosity -> what it shows.
LEVELS = {
    "quiet": Level(logging.ERROR, logging.ERROR, native=False, python_warnings="ignore"),
    "default": Level(logging.WARNING, logging.ERROR, native=False, python_warnings=None),
    "verbose": Level(logging.INFO, logging.WARNING, native=True, python_warnings=None),
}

#: TVM's Python loggers that warn about things the package handles (untuned fallbacks).
TVM_LOGGERS = ("autotvm", "te_compiler", "strategy")

#: Modules whose warnings are library banners, not about the user's work.
BANNER_MODULES = r"(pkg_resources|setuptools|_distutils_hack|distutils)(\.|$)"

#: A line of TVM's C++ log below error level: ``[12:00:00] /path/file.cc:99: Warning: ...`` (or no level).
NATIVE_LOG_LINE = re.compile(rb"^\[\d\d:\d\d:\d\d\] \S+:\d+: (Warning: )?(?!Error: |Debug: )")


#: The forwarder: a process of its own, so that what a crashing command writes last (an LLVM
#: abort, a segfault's message) still gets out after the command is gone.
_FORWARDER = (
    "import re, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # Ctrl-C is the command's to report
    "line_re = re.compile(sys.argv[1].encode())\n"
    "out = sys.stdout.buffer\n"
    "for line in sys.stdin.buffer:\n"
    "    if not line_re.match(line):\n"
    "        out.write(line); out.flush()\n"
)


class NativeLogFilter:
    """Drop TVM's C++ info and warning lines from file descriptor 2 while active.

    Python's own ``sys.stderr`` is pointed at a copy of the original
    descriptor, so the program's messages bypass the filter; what C++ code and
    child processes write to descriptor 2 goes through a pipe to a small
    forwarding process, which passes every line except those matching
    :data:`NATIVE_LOG_LINE`.

    Examples
    --------
    >>> NATIVE_LOG_LINE.match(b"[02:42:17] /tvm/src/relay/transforms/convert_layout.cc:99: Warning: x") is not None
    True
    >>> NATIVE_LOG_LINE.match(b"[02:42:17] /tvm/src/x.cc:9: Error: y") is None
    True
    """

    def __init__(self) -> None:
        self._saved: Optional[int] = None
        self._forwarder: Optional[subprocess.Popen] = None
        self._python_stderr = None

    def __enter__(self) -> "NativeLogFilter":
        sys.stderr.flush()
        self._saved = os.dup(2)
        read, write = os.pipe()
        self._forwarder = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FORWARDER, NATIVE_LOG_LINE.pattern.decode()],
            stdin=read, stdout=self._saved, stderr=subprocess.DEVNULL, close_fds=True,
        )
        os.close(read)
        os.dup2(write, 2)
        os.close(write)
        self._python_stderr = sys.stderr
        sys.stderr = io.TextIOWrapper(io.FileIO(self._saved, "w", closefd=False), encoding=sys.stderr.encoding,
                                      errors="backslashreplace", line_buffering=True)
        return self

    def __exit__(self, *exc) -> None:
        sys.stderr.flush()
        sys.stderr = self._python_stderr
        # Descriptor 2 back to the original closes the pipe's last writer (unless a child
        # process still holds it), which ends the forwarder once it has passed everything on.
        os.dup2(self._saved, 2)
        os.close(self._saved)
        try:
            self._forwarder.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a leftover child still holds the pipe: its lines still pass
            pass


def _filterable_stderr() -> bool:
    """Whether ``sys.stderr`` writes to descriptor 2 (not when a test captures it in memory)."""
    try:
        return sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False


@contextlib.contextmanager
def verbosity(name: str) -> Iterator[Level]:
    """Apply the verbosity ``name`` (a key of :data:`LEVELS`) inside the block; restore it after.

    Examples
    --------
    >>> with verbosity("verbose") as level:
    ...     level.native
    True
    """
    level = LEVELS[name]
    package = logging.getLogger("tvm_tcutils")
    loggers = {package: level.package, **{logging.getLogger(logger): level.tvm for logger in TVM_LOGGERS}}
    before = {logger: logger.level for logger in loggers}
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        if level.python_warnings:
            warnings.simplefilter(level.python_warnings)
        if name != "verbose":
            warnings.filterwarnings("ignore", module=BANNER_MODULES)
            warnings.filterwarnings("ignore", message=r".*pkg_resources is deprecated")
        if not level.native and _filterable_stderr():
            stack.enter_context(NativeLogFilter())
        handler = None
        if not package.handlers and not logging.getLogger().handlers:
            # Python's last-resort handler shows warnings only; -v wants the package's info lines.
            handler = logging.StreamHandler()  # after the filter: writes to the sys.stderr it set
            handler.setFormatter(logging.Formatter("tvm-tcutils: %(message)s"))
            package.addHandler(handler)
        for logger, value in loggers.items():
            logger.setLevel(value)
        try:
            yield level
        finally:
            for logger, value in before.items():
                logger.setLevel(value)
            if handler is not None:
                package.removeHandler(handler)
