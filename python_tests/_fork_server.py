"""A fork server for the tests' subprocess runs: TVM and the package are imported once, each run forks.

A new interpreter spends its first seconds importing TVM; a suite that starts about a
hundred of them (the CLI tests, the docs' snippets) spends minutes on that alone. This
server imports :data:`PRELOAD` once and, for each request (one JSON line on stdin),
forks a child that takes the request's environment, working folder and output files,
runs ``tvm-tcutils ARGS`` or a piece of Python code, and exits as the interpreter
would (``SystemExit`` codes, a traceback and status 1 for an uncaught exception, the
``atexit`` functions run). The server answers ``pid N`` when the child has started and
``status S`` when it has ended (``-SIGNAL`` for a signal, as :mod:`subprocess` does).

The server is single-threaded, so a forked child has no half-copied thread; nothing in
:data:`PRELOAD` starts a thread, a thread pool or an onnxruntime session at import.
Tests that are about a fresh interpreter (what ``import`` costs, what a bare TVM does
without the package) do not use it (``conftest.run_cli(fresh=True)``, ``run_python``).
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import traceback

#: Imported once by the server, before any fork.
PRELOAD = ["numpy", "tvm", "tvm.relay", "tvm_tcutils", "tvm_tcutils.cli"]


def _exit_status(err: SystemExit) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(request: dict) -> int:
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    for fd, path in ((1, request["out"]), (2, request["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # not the server's request pipe
    os.close(devnull)
    sys.stdin = open(0, closefd=False)
    try:
        if request["kind"] == "cli":
            from tvm_tcutils import cli

            sys.argv = ["tvm-tcutils", *request["payload"]]
            status = cli.main(list(request["payload"]))
        else:
            sys.argv = ["-c"]
            exec(compile(request["payload"], "<string>", "exec"), {"__name__": "__main__"})
            status = 0
    except SystemExit as err:
        status = _exit_status(err)
    except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return status if isinstance(status, int) else 0


def serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _tvm_speedups import cache_libinfo

    cache_libinfo()
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                status = _child(request)
            finally:
                os._exit(status & 0xFF)
        out.write(f"pid {pid}\n")
        out.flush()
        _, raw = os.waitpid(pid, 0)
        status = -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
        out.write(f"status {status}\n")
        out.flush()


if __name__ == "__main__":
    serve()
