"""Progress of long operations (Collage's search, tuning): a callback, or a bar on a terminal.

A long operation reports ``(phase, done, total)`` to a :class:`Reporter`;
the reporter hands a :class:`ProgressUpdate` to the caller's callback, or,
with no callback and stderr a terminal, draws a bar: tqdm's when tqdm is
installed (it is optional), else one line of text. ``progress=False``
silences both.

Examples
--------
>>> seen = []
>>> report = Reporter(seen.append)
>>> report("estimate", 3, 10)
>>> seen[0].phase, seen[0].done, seen[0].total
('estimate', 3, 10)
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, Optional, Union


@dataclasses.dataclass(frozen=True)
class ProgressUpdate:
    """Where a long operation stands: ``done`` of ``total`` steps of ``phase``, ``elapsed`` seconds in.

    Examples
    --------
    >>> str(ProgressUpdate("estimate", 3, 12, 1.5))
    'estimate 3/12 (1.5 s)'
    """

    phase: str
    done: int
    total: int
    elapsed: float

    def __str__(self) -> str:
        return f"{self.phase} {self.done}/{self.total} ({self.elapsed:.1f} s)"


ProgressArg = Union[None, bool, Callable[[ProgressUpdate], None]]


def check_progress(progress: ProgressArg) -> ProgressArg:
    """``progress`` if it is None, a bool or a callable.

    Examples
    --------
    >>> check_progress(print) is print
    True
    >>> check_progress("yes")
    Traceback (most recent call last):
    ...
    TypeError: progress must be a callable taking a ProgressUpdate, True, False or None, got str
    """
    if progress is None or isinstance(progress, bool) or callable(progress):
        return progress
    raise TypeError(f"progress must be a callable taking a ProgressUpdate, True, False or None, "
                    f"got {type(progress).__name__}")


class _TextBar:
    """One line on stderr, redrawn in place (when tqdm is not installed)."""

    def __call__(self, update: ProgressUpdate) -> None:
        width = 30
        filled = int(width * update.done / update.total) if update.total else width
        sys.stderr.write(f"\r{update.phase:<9} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{update.done}/{update.total} ({update.elapsed:.0f} s)")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


class _TqdmBar:
    """One tqdm bar per phase."""

    def __init__(self, tqdm):
        self.tqdm, self.bar, self.phase = tqdm, None, None

    def __call__(self, update: ProgressUpdate) -> None:
        if self.bar is None or update.phase != self.phase or update.total != self.bar.total:
            self.close()
            self.bar, self.phase = self.tqdm(total=update.total, desc=update.phase, leave=True), update.phase
        self.bar.update(update.done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _terminal_bar():
    try:
        from tqdm import tqdm
    except ImportError:  # optional: the package never requires it
        return _TextBar()
    return _TqdmBar(tqdm)


class Reporter:
    """Turns ``report(phase, done, total)`` calls into progress for a callback or a terminal bar.

    Parameters
    ----------
    progress : callable, bool or None
        A callable gets a :class:`ProgressUpdate` per call; ``None`` draws a
        bar when stderr is a terminal; ``True`` always draws one; ``False``
        nothing.
    clock : callable
        Seconds (``elapsed`` counts from the reporter's creation).

    Examples
    --------
    >>> report = Reporter(False); report("search", 1, 1); report.close()
    """

    def __init__(self, progress: ProgressArg = None, clock: Callable[[], float] = time.perf_counter):
        check_progress(progress)
        self.clock, self.start = clock, clock()
        self.callback: Optional[Callable[[ProgressUpdate], None]] = None
        self._bar = None
        if callable(progress) and not isinstance(progress, bool):
            self.callback = progress
        elif progress or (progress is None and sys.stderr.isatty()):
            self._bar = _terminal_bar()

    @property
    def elapsed(self) -> float:
        """Seconds since the reporter was created."""
        return self.clock() - self.start

    def __call__(self, phase: str, done: int, total: int) -> None:
        update = ProgressUpdate(phase, done, total, self.elapsed)
        if self.callback is not None:
            self.callback(update)
        elif self._bar is not None:
            self._bar(update)

    def close(self) -> None:
        """End the terminal bar's line (callbacks get nothing)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
