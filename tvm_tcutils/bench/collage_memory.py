"""Peak resident memory of a measured Collage search: the whole process tree, sampled from ``/proc``.

A search runs as a child process (``python -m tvm_tcutils collage MODEL
...``); every ``interval`` seconds the resident set sizes of the child and all
of its descendants (the measuring workers and anything they start) are summed,
and the largest sum is the peak. Linux only (``/proc``).

Examples
--------
>>> import sys
>>> run = run_sampled([sys.executable, "-c", "x = bytearray(64 << 20)"], interval=0.05)
>>> run.returncode, run.peak_bytes > 0
(0, True)
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

#: Bytes of one page, for ``/proc/PID/statm``.
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def children_of() -> Dict[int, List[int]]:
    """Every process's children, from ``/proc/*/stat`` (processes that vanish while read are skipped).

    Examples
    --------
    >>> os.getpid() in children_of().get(os.getppid(), [os.getpid()])
    True
    """
    tree: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:  # gone since listdir
            continue
        # The command name may hold spaces and parentheses: the fields after it start past the last ')'.
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_rss(root: int) -> Dict[int, int]:
    """Resident bytes of ``root`` and of each of its descendants now: pid -> bytes.

    Examples
    --------
    >>> tree_rss(os.getpid())[os.getpid()] > 0
    True
    """
    tree = children_of()
    sizes, todo = {}, [root]
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, ()))
        try:
            with open(f"/proc/{pid}/statm") as handle:
                sizes[pid] = int(handle.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):  # exited between the two reads
            continue
    return sizes


@dataclasses.dataclass
class SampledRun:
    """How a sampled child process ended: exit status, peak tree RSS (and the child's own), seconds, output."""

    returncode: Optional[int]
    peak_bytes: int
    peak_root_bytes: int
    seconds: float
    timed_out: bool
    output_tail: str

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / 2 ** 30


def run_sampled(command: Sequence[str], interval: float = 0.2, timeout: Optional[float] = None,
                env: Optional[Dict[str, str]] = None, log_path: Optional[str] = None) -> SampledRun:
    """Run ``command``, sampling its process tree's RSS every ``interval`` s until it exits or ``timeout``.

    On ``timeout`` the child's whole process group is killed and the peak
    reached so far is returned (``timed_out``). Output goes to ``log_path``
    (default: a temporary file); its last 2,000 characters are kept.
    """
    import signal
    import tempfile

    log = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()
    start = time.monotonic()
    child = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    peak, peak_root, timed_out = 0, 0, False
    try:
        while child.poll() is None:
            sizes = tree_rss(child.pid)
            peak, peak_root = max(peak, sum(sizes.values())), max(peak_root, sizes.get(child.pid, 0))
            if timeout is not None and time.monotonic() - start > timeout:
                timed_out = True
                break
            time.sleep(interval)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
        log.close()
    return SampledRun(child.returncode, peak, peak_root, time.monotonic() - start, timed_out, tail)


def collage_command(model: str, toolchains: str, workers: int, cache_dir: str, timeout: float,
                    extra: Sequence[str] = ()) -> List[str]:
    """The measured Collage search run as the child.

    Examples
    --------
    >>> collage_command("mlp", "tvm", 1, "/tmp/c", 30)[1:4]
    ['-m', 'tvm_tcutils', 'collage']
    """
    return [sys.executable, "-m", "tvm_tcutils", "collage", model, "--toolchains", toolchains,
            "--estimator", "measured", "--workers", str(workers), "--cache-dir", cache_dir,
            "--timeout", str(timeout), *extra]


def measured_count(log_file: str) -> int:
    """Candidates measured so far: lines of the search's ``--log`` file (0 when it does not exist yet).

    Examples
    --------
    >>> measured_count("/no/such/log")
    0
    """
    try:
        with open(log_file) as handle:
            return sum(1 for _ in handle)
    except FileNotFoundError:
        return 0
