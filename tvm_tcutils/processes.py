"""Process lifetime: workers die with their parent, and a reaper kills what a killed command left running.

A command killed with SIGKILL runs no cleanup, so the processes it started
(AutoTVM's measuring pools, its local RPC tracker and server and the forks
that server makes per measurement, Collage's measuring workers and whatever
their toolchains start) would run on, for minutes. Two mechanisms stop that:

* :func:`die_with_parent`, called first thing in a worker: the kernel sends the
  worker a signal when its parent dies (Linux ``PR_SET_PDEATHSIG``);
* :func:`reaper`, around a long command: a small watchdog process records the
  command's process tree from ``/proc`` a few times a second and, when the
  command dies (or the ``with`` block ends), stops and then kills every process
  of that tree, including grandchildren that TVM's own pools start and that the
  package cannot configure. Processes are told apart by pid *and* start time,
  so a reused pid is never hit; besides the recorded tree, every process whose
  environment carries the reaper's token (``TVM_TCUTILS_REAPER``, inherited by
  everything the command starts after the reaper) counts as the command's, which
  covers children that were re-parented before the watchdog saw them. The
  watchdog never signals itself, its ancestors or (on a normal end) the command.

This module imports only the standard library: the watchdog runs it as a
script (``python -I -S processes.py watch ...``), so it starts in a few tens of
milliseconds, without TVM, and never forks a process that holds TVM's threads.
On systems other than Linux both mechanisms are no-ops.

Examples
--------
>>> import subprocess, sys
>>> with reaper():
...     left_running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
>>> left_running.wait(timeout=10)   # the reaper killed it when the block ended
-9
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import types
from typing import Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set

logger = logging.getLogger("tvm_tcutils.processes")

#: Environment variable naming the tokens of the reapers a process belongs to (space-separated).
ENV_VAR = "TVM_TCUTILS_REAPER"

#: ``tvm-tcutils`` subcommands that start processes and run under a :func:`reaper`.
REAPED_COMMANDS = frozenset({"tune", "bench", "collage"})

#: ``subprocess.Popen`` options for a worker: its own session and process group, so that
#: :func:`kill_group` ends the worker and everything it started, and a Ctrl-C in the terminal
#: reaches the parent only (which stops its workers itself).
WORKER_POPEN_OPTIONS: Mapping[str, object] = types.MappingProxyType({"start_new_session": True})

_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
#: The signal the kernel sends the watchdog when the command dies; handled, it only wakes the watchdog up.
_WAKE = signal.SIGUSR1
#: Seconds the command waits for its watchdog to start, and for it to finish on a normal end.
_START_TIMEOUT = 20.0
_STOP_TIMEOUT = 20.0
#: Rounds of "stop what was found, look again" before the stopped processes are killed.
_FREEZE_ROUNDS = 50
#: States of ``/proc/PID/stat`` of a process that has ended (zombie, dead).
_ENDED = frozenset("ZX")


class ProcInfo(NamedTuple):
    """One row of :func:`process_table`."""

    ppid: int
    #: Start time in clock ticks after boot: with the pid, it names one process (pids are reused).
    start: int
    #: One letter of ``/proc/PID/stat``: R running, S sleeping, T stopped, Z zombie ...
    state: str


def _prctl(option: int, value: int = 0) -> int:
    import ctypes  # only here: the module must import fast, and only Linux has prctl

    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.prctl(option, value, 0, 0, 0)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({option}): {os.strerror(code)}")
    return result


def all_cpus() -> set:
    """Every online CPU, as far as this process may use them.

    A process inherits its parent's CPU mask, and TVM's thread pool pins the thread that launches it
    to one core: a worker started by a parent that ran TVM code would otherwise be confined to it.
    """
    try:
        with open("/sys/devices/system/cpu/online") as online:
            cpus = set()
            for part in online.read().strip().split(","):
                low, _, high = part.partition("-")
                cpus.update(range(int(low), int(high or low) + 1))
            return cpus
    except (OSError, ValueError):
        return set(range(os.cpu_count() or 1))


#: Environment variable holding the CPUs the first process of this tree that imported the package was
#: given (read at import, before TVM's thread pool could pin a thread); its children inherit it.
CPUS_ENV = "TCUTILS_CPUS"

if CPUS_ENV not in os.environ and hasattr(os, "sched_getaffinity"):
    os.environ[CPUS_ENV] = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))


def given_cpus() -> set:
    """The CPUs this process tree was given (:data:`CPUS_ENV`), as far as they are online.

    Examples
    --------
    >>> given_cpus() <= all_cpus()
    True
    """
    online = all_cpus()
    try:
        given = {int(cpu) for cpu in os.environ.get(CPUS_ENV, "").split(",") if cpu.strip()}
    except ValueError:
        given = set()
    return (given & online) or online


def unpin() -> bool:
    """Let this process run on every CPU its tree was given again (:func:`given_cpus`); whether that was
    allowed.

    TVM pins the thread that configures a one-thread pool to one core (its default on a 2-CPU x86
    machine: half the CPUs), and a process started after that inherits the mask: measuring and
    compiling workers of a tuning session or a Collage search would all share that core. Called first
    in those workers. A tree started on some CPUs only (``taskset``) stays on those.

    Examples
    --------
    >>> unpin() in (True, False)
    True
    """
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(0, given_cpus())
    except OSError:  # a cpuset narrower than the online CPUs: keep what was inherited
        return False
    return True


def die_with_parent(parent: Optional[int] = None, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send this process ``sig`` when its parent dies (Linux; a no-op elsewhere).

    Call it first thing in a worker. If the parent died before the call (the
    worker was re-parented already), the kernel would never send the signal, so
    the process sends it to itself: with the default ``SIGKILL`` it does not
    return.

    The kernel watches the parent's *thread* that started this process, not the
    whole process: start workers from a thread that lives as long as they should
    (the main thread, or a pool's long-lived thread).

    Parameters
    ----------
    parent : int, optional
        The pid the parent had (``os.getpid()`` in the parent, passed to the
        worker); the default, the current parent, cannot see a parent that died
        before this call.
    sig : int
        Signal to receive; a handled signal (e.g. ``SIGUSR1``) lets the process
        clean up first.

    Returns
    -------
    bool
        True when the signal is armed and the parent is alive; False off Linux
        or when the parent was gone (after sending ``sig`` to itself).

    Examples
    --------
    Run in a child process, so that the test runner's own parent-death signal stays unset:

    >>> import subprocess, sys
    >>> code = ("import os, runpy; ns = runpy.run_path(%r); "
    ...         "print(ns['die_with_parent'](os.getppid()), ns['parent_death_signal']())" % __file__)
    >>> subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True).stdout.split()
    ['True', '9']
    """
    if not _LINUX:
        return False
    expected = os.getppid() if parent is None else parent
    _prctl(_PR_SET_PDEATHSIG, int(sig))
    # Checked after arming: a parent dying after this line is caught by the kernel.
    if os.getppid() != expected:
        os.kill(os.getpid(), sig)
        return False
    return True


def parent_death_signal() -> int:
    """The signal this process gets when its parent dies, 0 for none (always 0 off Linux).

    Examples
    --------
    >>> parent_death_signal() in range(65)
    True
    """
    if not _LINUX:
        return 0
    import ctypes

    value = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_GET_PDEATHSIG): {os.strerror(code)}")
    return value.value


def _stat(pid: int) -> Optional[ProcInfo]:
    return _stat_path(f"/proc/{pid}/stat")


def _stat_path(path: str) -> Optional[ProcInfo]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError):  # ended between listing and reading
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(b")") + 2:].split()
    return ProcInfo(ppid=int(fields[1]), start=int(fields[19]), state=fields[0].decode())


def process_table() -> Dict[int, ProcInfo]:
    """Every process on the machine: pid -> :class:`ProcInfo`, from ``/proc`` (empty without it).

    Examples
    --------
    >>> table = process_table()
    >>> table[os.getpid()].ppid == os.getppid()
    True
    """
    if not _LINUX:
        return {}
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                table[int(name)] = info
    return table


def _children(table: Mapping[int, ProcInfo]) -> Dict[int, list]:
    children: Dict[int, list] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
    return children


def _tree(roots, table: Mapping[int, ProcInfo], skip: Mapping[int, int] = types.MappingProxyType({})) -> Dict[int, int]:
    """Descendants of ``roots`` (not the roots): pid -> start, not entering processes listed in ``skip``."""
    children = _children(table)
    found: Dict[int, int] = {}
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            start = table[child].start
            if child in found or skip.get(child) == start:
                continue
            found[child] = start
            todo.append(child)
    return found


def descendants(pid: int) -> Dict[int, int]:
    """The live descendants of ``pid`` (children, grandchildren ...): pid -> start time.

    Examples
    --------
    >>> import subprocess, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    >>> child.pid in descendants(os.getpid())
    True
    >>> child.kill(); child.wait()
    -9
    """
    table = process_table()
    return {p: s for p, s in _tree([pid], table).items() if table[p].state not in _ENDED}


def alive(pid: int, start: int) -> bool:
    """Whether the process ``pid`` started at ``start`` (a :func:`descendants` value) still runs.

    A zombie (ended, not yet waited for) is not alive; a pid reused by another process is not it.

    Examples
    --------
    >>> me = process_table()[os.getpid()]
    >>> alive(os.getpid(), me.start), alive(os.getpid(), me.start + 1)
    (True, False)
    """
    info = _stat(pid)
    return info is not None and info.start == start and info.state not in _ENDED


def _send(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to the process (pid, start); False when it is gone or not ours to signal."""
    try:
        handle = os.pidfd_open(pid)  # pins the process: a pid reused after the check is not hit
    except ProcessLookupError:
        return False
    except OSError:  # kernel without pidfd: the start-time check alone guards against reuse
        handle = None
    try:
        info = _stat(pid)
        if info is None or info.start != start or info.state in _ENDED:
            return False
        if handle is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(handle, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if handle is not None:
            os.close(handle)


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Kill a worker started with :data:`WORKER_POPEN_OPTIONS` and every process in its group.

    Call it before ``process.wait()``: once the worker is waited for, its pid
    names nothing of ours. A worker started without its own group gets
    ``process.kill()`` semantics only (its group is the parent's: never signalled).

    Examples
    --------
    >>> import subprocess, sys
    >>> sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    >>> code = f"import subprocess, time; subprocess.Popen({sleep!r}); time.sleep(60)"
    >>> worker = subprocess.Popen([sys.executable, "-c", code], **WORKER_POPEN_OPTIONS)
    >>> kill_group(worker); worker.wait()
    -9
    """
    if process.returncode is None and _LINUX:
        try:
            if os.getpgid(process.pid) == process.pid:
                os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
    if process.returncode is None:
        process.send_signal(sig)


def hold(process: subprocess.Popen) -> None:
    """Stop a child ``process`` (``SIGSTOP``; its whole group where it leads one, as workers started with
    :data:`WORKER_POPEN_OPTIONS` do) and wait until every thread of it has stopped (the kernel's group stop),
    so that none of its threads -- a runtime's spinning pool -- takes a core from a process being timed.

    Raises
    ------
    RuntimeError
        The process ended instead of stopping.

    Examples
    --------
    >>> import subprocess, sys
    >>> worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **WORKER_POPEN_OPTIONS)
    >>> hold(worker); _stat(worker.pid).state
    'T'
    >>> release(worker); kill_group(worker); worker.wait()
    -9
    """
    leads = _LINUX and os.getpgid(process.pid) == process.pid
    os.killpg(process.pid, signal.SIGSTOP) if leads else os.kill(process.pid, signal.SIGSTOP)
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        # The status was reaped here: give it to the Popen, which would wait for ever otherwise.
        process.returncode = os.waitstatus_to_exitcode(status)
        raise RuntimeError(f"process {process.pid} ended instead of stopping")


def release(process: subprocess.Popen) -> None:
    """Let a process :func:`hold` stopped run again (nothing where it has ended)."""
    if process.poll() is None:
        leads = _LINUX and os.getpgid(process.pid) == process.pid
        os.killpg(process.pid, signal.SIGCONT) if leads else os.kill(process.pid, signal.SIGCONT)


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or it has ended), read from ``/proc`` (True without it)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return True
    for tid in tasks:
        info = _stat_path(f"/proc/{pid}/task/{tid}/stat")
        if info is not None and info.state not in ("T", "t") and info.state not in _ENDED:
            return False
    return True


@contextlib.contextmanager
def paused(processes: Sequence[subprocess.Popen], still: Callable[[subprocess.Popen], bool] = lambda p: True,
           timeout: float = 5.0) -> Iterator[List[subprocess.Popen]]:
    """While the block runs, the running ``processes`` are stopped (``SIGSTOP``, their groups as in
    :func:`hold`); after it, those for which ``still(process)`` holds run again (``SIGCONT``).

    For timing one process while others work (a search's whole-model builds on the other cores took a
    timed BERT-base from 63 to 120-143 ms on 2 vCPUs). Unlike :func:`hold` it reaps no status (it waits
    until ``/proc`` shows every thread stopped): another thread may :func:`hold` the same process meanwhile
    (a build ending holds its worker), and that one's ``waitpid`` must still see the stop. ``still`` says
    which to let run again (not one its owner has held since).

    Examples
    --------
    >>> import subprocess, sys
    >>> worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **WORKER_POPEN_OPTIONS)
    >>> with paused([worker]) as stopped:
    ...     _stat(worker.pid).state, len(stopped)
    ('T', 1)
    >>> _stat(worker.pid).state in ("S", "R")
    True
    >>> kill_group(worker); worker.wait()
    -9
    """
    stopped = []
    for process in processes:
        if process.poll() is None:
            try:
                kill_group(process, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            stopped.append(process)
    end = time.monotonic() + timeout
    for process in stopped:
        while not _all_threads_stopped(process.pid) and time.monotonic() < end:
            time.sleep(0.001)
    try:
        yield stopped
    finally:
        for process in stopped:
            if still(process):
                release(process)


def _carriers(table: Mapping[int, ProcInfo], token: str, since: int) -> Dict[int, int]:
    """Processes started at or after ``since`` whose environment names ``token``: pid -> start."""
    key = f"{ENV_VAR}=".encode()
    found = {}
    for pid, info in table.items():
        if info.start < since or info.state in _ENDED:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError):  # ended, or another user's
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(key) and token in entry[len(key):].decode(errors="replace").split():
                found[pid] = info.start
    return found


def _ancestors(pid: int, table: Mapping[int, ProcInfo]) -> Set[int]:
    found = set()
    while pid in table and pid not in found:
        found.add(pid)
        pid = table[pid].ppid
    return found


def _reap(command: int, command_alive: bool, old: Mapping[int, int], known: Mapping[int, int],
          token: str, since: int) -> int:
    """Stop, then kill, every process of the command; returns how many were killed.

    Stopping first freezes the tree: a process cannot start another between
    being found and being killed, so repeated looks find everything.
    """
    stopped: Dict[int, int] = {}
    for _ in range(_FREEZE_ROUNDS):
        table = process_table()
        spare = _ancestors(os.getpid(), table)  # the watchdog, and on a normal end the command and its callers
        targets = {pid: start for pid, start in known.items() if pid in table and table[pid].start == start}
        if command_alive:
            targets.update(_tree([command], table, skip=old))
        targets.update(_carriers(table, token, since))
        targets.update(_tree(list(targets), table))
        new = {pid: start for pid, start in targets.items()
               if pid not in stopped and pid not in spare and table[pid].state not in _ENDED}
        if not new:
            break
        for pid, start in new.items():
            if _send(pid, start, signal.SIGSTOP):
                stopped[pid] = start
        time.sleep(0.02)  # lets the stops land before the next look
    for pid, start in stopped.items():
        _send(pid, start, signal.SIGKILL)
    return len(stopped)


def _watch(command: int, token: str, control_fd: int, ready_fd: int, interval: float) -> None:
    """The watchdog's main loop (runs in its own process, started by :class:`Reaper`)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(_WAKE, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)  # the parent-death signal wakes the select below at once
    die_with_parent(command, _WAKE)
    table = process_table()
    me = os.getpid()
    since = table[me].start
    # What the command ran before the reaper started is not this command's (an API caller's own workers).
    old = {pid: start for pid, start in _tree([command], table).items() if pid != me}
    known: Dict[int, int] = {}
    os.write(ready_fd, b"r")
    os.close(ready_fd)
    message = b""
    while os.getppid() == command:
        table = process_table()
        known = {pid: start for pid, start in known.items() if pid in table and table[pid].start == start}
        known.update(_tree([command], table, skip=old))
        known.pop(me, None)
        readable = select.select([control_fd, wake_r], [], [], interval)[0]
        if wake_r in readable:
            os.read(wake_r, 64)  # a thread of the command ended, or the command did: getppid says which
        if control_fd in readable:
            message = os.read(control_fd, 1)  # b"s": reap and end; b"q": just end; b"": the command is gone
            break
    if message == b"q":
        return
    _reap(command, os.getppid() == command, old, known, token, since)


class Reaper:
    """A watchdog process that kills the calling process's new processes when it dies or on :meth:`stop`.

    Prefer the :func:`reaper` context manager; a ``Reaper`` left running ends
    with the process that started it, killing what that process left running.

    Parameters
    ----------
    interval : float
        Seconds between two records of the process tree.

    Examples
    --------
    >>> watchdog = Reaper()
    >>> watchdog.ready, watchdog.process.poll() is None
    (True, True)
    >>> watchdog.stop()
    >>> watchdog.process.returncode
    0
    """

    def __init__(self, interval: float = 0.3) -> None:
        self._owner = os.getpid()
        self.token = f"{self._owner}.{secrets.token_hex(6)}"
        control_r, self._control = os.pipe()
        ready_r, ready_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), "watch", str(os.getpid()), self.token,
                 str(control_r), str(ready_w), str(interval)],
                pass_fds=(control_r, ready_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                # Its own session: a Ctrl-C meant for the command does not end the watchdog first.
                start_new_session=True,
            )
        except OSError:
            os.close(self._control)
            os.close(ready_r)
            raise
        finally:
            os.close(control_r)
            os.close(ready_w)
        try:
            self.ready = bool(select.select([ready_r], [], [], _START_TIMEOUT)[0] and os.read(ready_r, 1))
        finally:
            os.close(ready_r)
        if not self.ready:
            logger.warning("the process reaper did not start within %.0f s; processes of a killed command "
                           "may keep running", _START_TIMEOUT)
        self._previous = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = " ".join(filter(None, [self._previous, self.token]))

    def stop(self, reap: bool = True) -> None:
        """End the watchdog; with ``reap``, it first kills what the process started since and left running."""
        if self._control < 0:
            return
        if os.getpid() != self._owner:  # a fork of the owner leaving the block: the owner still runs
            os.close(self._control)
            self._control = -1
            return
        if self._previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = self._previous
        try:
            os.write(self._control, b"s" if reap else b"q")
        except BrokenPipeError:  # the watchdog is gone already
            pass
        finally:
            os.close(self._control)
            self._control = -1
        try:
            self.process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            logger.warning("the process reaper did not finish within %.0f s; stopped it", _STOP_TIMEOUT)
            self.process.kill()
            self.process.wait()


_active: Optional[Reaper] = None


@contextlib.contextmanager
def reaper(enabled: bool = True, interval: float = 0.3) -> Iterator[Optional[Reaper]]:
    """Run the block under a :class:`Reaper`: if this process dies, its new processes die too.

    When the block ends (normally or by an exception), processes started in it
    and still running are killed as well. Nested uses, and uses with
    ``enabled=False`` or off Linux, do nothing (yield None).

    Note that on a normal end "processes started in the block" includes those
    that other threads of this process started meanwhile.

    Examples
    --------
    >>> with reaper(enabled=False) as watchdog:
    ...     watchdog is None
    True
    >>> with reaper() as outer, reaper() as inner:
    ...     outer is not None, inner is None
    (True, True)
    """
    global _active
    if not enabled or not _LINUX or _active is not None:
        yield None
        return
    _active = Reaper(interval)
    try:
        yield _active
    finally:
        watchdog, _active = _active, None
        watchdog.stop()


def _main(argv) -> None:
    command, token, control_fd, ready_fd, interval = argv
    _watch(int(command), token, int(control_fd), int(ready_fd), float(interval))


if __name__ == "__main__" and sys.argv[1:2] == ["watch"]:
    _main(sys.argv[2:])


class PackageServerInit:
    """A TVM RPC server's start-up callback (``server_init_callback``): the server's process dies with
    ``parent`` and has imported :mod:`tvm_tcutils` before it serves, which registers the package's runtime
    functions -- the toolchains' packed functions, and on a TVM built without CUDA the CUDA plugin's device
    API. A picklable object: TVM sends it to the server's process.

    Examples
    --------
    >>> PackageServerInit(1).parent
    1
    """

    def __init__(self, parent: int):
        self.parent = parent

    def __call__(self) -> None:
        die_with_parent(self.parent)
        # Nothing to import: unpickling this object in the server's process imported its module, and Python
        # imports a module's package first -- tvm_tcutils/__init__.py, which registers everything.
        assert "tvm_tcutils" in sys.modules
