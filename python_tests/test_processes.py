"""No process left behind: parent-death signals and the reaper, with real processes (issue 20).

The "commands" here are small Python programs that load ``tvm_tcutils/processes.py``
by its path (no TVM import: they start in milliseconds), start processes, and
are killed with SIGKILL; the end-to-end tests kill ``tvm-tcutils tune`` and
``tvm-tcutils collage`` while AutoTVM's and Collage's workers run.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, Iterable, List

import pytest

from conftest import ROOT, run_python, small_conv_net
from tvm_tcutils import processes, tuning
from tvm_tcutils.models import save_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, prctl)")

#: The promise of issue 20: seconds after the command's death by which none of its processes runs.
GRACE_S = 10.0

#: Child-program prelude: the module loaded from its file, as ``P``, without importing TVM.
LOAD = (
    "import importlib.util, json, os, subprocess, sys, time\n"
    f"spec = importlib.util.spec_from_file_location('tcutils_processes', {processes.__file__!r})\n"
    "P = importlib.util.module_from_spec(spec); sys.modules[spec.name] = P; spec.loader.exec_module(P)\n"
    "SLEEP = [sys.executable, '-c', 'import time; time.sleep(120)']\n"
)


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LOAD + code], stdout=subprocess.PIPE, text=True)


def _report(command: subprocess.Popen) -> dict:
    """The JSON line a child program prints once its processes are in place."""
    line = command.stdout.readline()
    assert line, f"the command ended early with status {command.wait()}"
    return json.loads(line)


def _started(pids: Iterable[int]) -> Dict[int, int]:
    table = processes.process_table()
    return {pid: table[pid].start for pid in pids if pid in table}


def _survivors(procs: Dict[int, int], within: float = GRACE_S) -> List[int]:
    """Processes of ``procs`` (pid -> start) still running ``within`` seconds from now (polled)."""
    deadline = time.monotonic() + within
    while True:
        left = [pid for pid, start in procs.items() if processes.alive(pid, start)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _kill_all(procs: Dict[int, int]) -> None:
    """Test clean-up: whatever a failed test left running."""
    for pid, start in procs.items():
        if processes.alive(pid, start):
            os.kill(pid, signal.SIGKILL)


def _sigkill(command: subprocess.Popen) -> None:
    command.kill()
    command.wait()
    command.stdout.close()


@pytest.mark.timeout(60)
def test_reaper_kills_the_tree_of_a_killed_command():
    """Child, grandchild, a fork (no exec) and a re-parented orphan: none runs 10 s after the SIGKILL."""
    command = _start(
        "watchdog = P.Reaper(interval=0.1)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
        "subprocess.Popen(%r); time.sleep(120)' % SLEEP])\n"
        # The orphan's parent exits at once: the orphan is re-parented, out of the command's tree.
        "middle = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys; "
        "print(subprocess.Popen(%r).pid)' % SLEEP], stdout=subprocess.PIPE, text=True)\n"
        "orphan = int(middle.stdout.readline()); middle.wait()\n"
        "if os.fork() == 0:\n"
        "    time.sleep(120); os._exit(0)\n"
        "time.sleep(1.0)\n"  # the grandchild is up and the watchdog has recorded the tree
        "print(json.dumps({'watchdog': watchdog.process.pid, 'orphan': orphan}), flush=True)\n"
        "time.sleep(120)\n"
    )
    report = _report(command)
    tree = processes.descendants(command.pid)
    tree.update(_started([report["orphan"]]))
    try:
        # watchdog, child, grandchild, fork, orphan
        assert len(tree) == 5 and report["watchdog"] in tree and report["orphan"] in tree, tree
        _sigkill(command)
        assert _survivors(tree) == []
    finally:
        _kill_all(tree)


@pytest.mark.timeout(60)
def test_reaper_spares_processes_that_are_not_the_commands():
    """A sibling of the command, and what the command ran before its reaper started, keep running."""
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    command = _start(
        "before = subprocess.Popen(SLEEP)\n"
        "watchdog = P.Reaper(interval=0.1)\n"
        "after = subprocess.Popen(SLEEP)\n"
        "time.sleep(0.5)\n"
        "print(json.dumps({'before': before.pid, 'after': after.pid, 'watchdog': watchdog.process.pid}), flush=True)\n"
        "time.sleep(120)\n"
    )
    report = _report(command)
    spared = _started([sibling.pid, report["before"]])
    reaped = _started([report["after"], report["watchdog"]])
    try:
        assert len(spared) == 2 and len(reaped) == 2
        _sigkill(command)
        assert _survivors(reaped) == []
        time.sleep(1.0)  # the watchdog is gone: anything it would have killed is dead by now
        assert all(processes.alive(pid, start) for pid, start in spared.items())
        assert processes.alive(os.getpid(), processes.process_table()[os.getpid()].start)
    finally:
        _kill_all({**spared, **reaped})
        sibling.wait()


@pytest.mark.timeout(60)
def test_reaper_block_end_kills_its_leftovers_only(monkeypatch):
    """On a normal end of the block, processes started in it are killed; older ones and the caller are not."""
    monkeypatch.delenv(processes.ENV_VAR, raising=False)
    older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with processes.reaper(interval=0.1) as watchdog:
            assert watchdog is not None and os.environ[processes.ENV_VAR] == watchdog.token
            inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        assert inside.wait(timeout=GRACE_S) == -signal.SIGKILL
        assert watchdog.process.returncode == 0
        assert older.poll() is None
        assert processes.ENV_VAR not in os.environ
    finally:
        older.kill()
        older.wait()


@pytest.mark.timeout(60)
def test_die_with_parent_ends_a_child_when_its_parent_is_killed():
    command = _start(
        "code = %r + 'print(json.dumps({\"pid\": os.getpid(), \"armed\": P.die_with_parent(int(sys.argv[1])), "
        "\"signal\": P.parent_death_signal()}), flush=True); time.sleep(120)'\n"
        "worker = subprocess.Popen([sys.executable, '-c', code, str(os.getpid())])\n"
        "time.sleep(120)\n" % LOAD
    )
    report = _report(command)  # printed by the worker, on the command's stdout
    worker = _started([report["pid"]])
    try:
        assert report["armed"] and report["signal"] == signal.SIGKILL and worker
        _sigkill(command)
        assert _survivors(worker) == []
    finally:
        _kill_all(worker)


@pytest.mark.timeout(60)
def test_die_with_parent_when_the_parent_died_first():
    """The parent is not the one expected (it died before the call): the worker ends itself at once."""
    code = LOAD + "P.die_with_parent(int(sys.argv[1])); time.sleep(120)"
    worker = subprocess.run([sys.executable, "-c", code, str(os.getppid())], timeout=30)
    assert worker.returncode == -signal.SIGKILL


@pytest.fixture
def worker_and_child():
    """``(worker, {its child's pid: start})``: a worker in its own group, as Collage's, that started a
    process; both ended afterwards whatever the test did."""
    code = LOAD + "print(subprocess.Popen(SLEEP).pid, flush=True); time.sleep(120)"
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              **processes.WORKER_POPEN_OPTIONS)
    grandchild = _started([int(worker.stdout.readline())])
    try:
        yield worker, grandchild
    finally:
        processes.kill_group(worker)
        worker.wait()
        _kill_all(grandchild)
        worker.stdout.close()


@pytest.mark.timeout(60)
def test_kill_group_ends_a_worker_and_what_it_started(worker_and_child):
    worker, grandchild = worker_and_child
    processes.kill_group(worker)
    assert worker.wait(timeout=GRACE_S) == -signal.SIGKILL
    assert _survivors(grandchild) == []


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _eventually(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_hold_stops_a_worker_and_what_it_started_until_released(worker_and_child):
    worker, grandchild = worker_and_child
    processes.hold(worker)
    assert _state(worker.pid) == "T"  # hold waited for it
    assert _eventually(lambda: all(_state(pid) == "T" for pid in grandchild))  # the group's signal lands
    processes.release(worker)
    assert _eventually(lambda: all(_state(pid) != "T" for pid in [worker.pid, *grandchild]))


def test_hold_on_a_process_that_ended_raises_and_leaves_its_status():
    worker = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], **processes.WORKER_POPEN_OPTIONS)
    while processes._stat(worker.pid).state not in ("Z", "X"):
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="ended instead of stopping"):
        processes.hold(worker)
    assert worker.wait(timeout=5) == 3
    processes.release(worker)  # nothing to let run: no error


@pytest.mark.timeout(120)
def test_tuning_pool_workers_die_with_the_tuning_process_and_keep_their_time_limit():
    from tvm import autotvm

    # A 1 s limit: the pool enforces it in the worker around the call (the worker's start does not count),
    # so the sleep below still has to be cut by the limit the replacement pool kept.
    builder = autotvm.LocalBuilder(timeout=1)
    tuning._workers_die_with_us(builder, builder.timeout)
    # Started by a process whose thread TVM pinned to one core, the workers still get every CPU the tree
    # was given (the pool starts its worker on the first call).
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    try:
        assert builder.executor.submit(processes.parent_death_signal).result() == signal.SIGKILL
    finally:
        os.sched_setaffinity(0, mask)
    assert builder.executor.submit(os.sched_getaffinity, 0).result() == processes.given_cpus()
    with pytest.raises(TimeoutError):
        builder.executor.submit(time.sleep, 60).result()


@pytest.mark.parametrize("given", ["all", "first"])
def test_unpin_gives_back_the_cpus_the_tree_was_given_and_no_more(given):
    cpus = sorted(processes.all_cpus() & os.sched_getaffinity(0))
    allowed = cpus if given == "all" else cpus[:1]
    code = ("import os; os.sched_setaffinity(0, {%d}); from tvm_tcutils import processes; "
            "print(processes.unpin(), sorted(os.sched_getaffinity(0)))" % cpus[0])
    # Forked from the tests' fork server (the package imported there): unpin reads the tree's CPUs from the
    # child's own environment when it is called, as in a fresh interpreter given the same environment.
    out = run_python(code, env={processes.CPUS_ENV: ",".join(map(str, allowed))}, timeout=120, fresh=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"True {allowed}"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _under_reaper(pid: int) -> bool:
    """Whether the process's environment names a reaper (so the reaper finds it even re-parented)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"{processes.ENV_VAR}=".encode() in handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _kill_while_running(args: List[str], marker: str, count: int, cwd: str, timeout: float) -> Dict[int, int]:
    """Start ``tvm-tcutils ARGS``, wait until ``count`` of its descendants' command lines hold ``marker``,
    SIGKILL it; returns every descendant seen (pid -> start).

    The workers found must carry the reaper's token: a worker that happens to end
    by itself (an idle one reads end-of-file when its parent dies) does not prove the reaper.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.pop(processes.ENV_VAR, None)
    with open(os.path.join(cwd, "stderr.txt"), "w") as err:
        command = subprocess.Popen([sys.executable, "-m", "tvm_tcutils", *args], cwd=cwd, env=env,
                                   stdout=subprocess.DEVNULL, stderr=err)
    seen: Dict[int, int] = {}
    try:
        deadline = time.monotonic() + timeout
        while True:
            tree = processes.descendants(command.pid)
            seen.update(tree)
            workers = [pid for pid in tree if marker in _cmdline(pid)]
            if len(workers) >= count:
                assert all(_under_reaper(pid) for pid in workers), [_cmdline(pid) for pid in workers]
                break
            if command.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(cwd, "stderr.txt")) as err:
                    pytest.fail(f"no {count} workers ({marker}) after {timeout:.0f} s, status {command.poll()}: "
                                f"{err.read()[-2000:]}")
            time.sleep(0.2)
        seen.update(processes.descendants(command.pid))
    finally:
        command.kill()
        command.wait()
    return seen


@pytest.mark.timeout(300)
def test_nothing_of_a_killed_tune_command_runs_10_s_later(tmp_path):
    """AutoTVM's build and run pools, its RPC tracker and server: all gone after a SIGKILL of ``tune``.

    Without the reaper the tracker and the server (TVM starts them; the package
    cannot configure them) ran on for as long as the machine did.
    """
    model = str(tmp_path / "net.json")
    save_model(model, small_conv_net(channels=16, size=8))
    args = ["tune", model, "--trials", "50", "--log", str(tmp_path / "net.log"), "--no-progress"]
    # Two build workers, the runner's worker, the RPC tracker and the RPC server.
    seen = _kill_while_running(args, "tvm.exec.popen_worker", 5, str(tmp_path), timeout=240)
    try:
        assert _survivors(seen) == [], [_cmdline(pid) for pid in seen]
    finally:
        _kill_all(seen)


@pytest.mark.timeout(300)
def test_nothing_of_a_killed_collage_command_runs_10_s_later(tmp_path):
    """Collage's measuring workers: all gone after a SIGKILL of ``collage``."""
    args = ["collage", "mlp", "--workers", "2", "--cache-dir", str(tmp_path / "cache"), "--no-compare"]
    seen = _kill_while_running(args, "worker_entry", 2, str(tmp_path), timeout=240)
    try:
        assert _survivors(seen) == [], [_cmdline(pid) for pid in seen]
    finally:
        _kill_all(seen)
