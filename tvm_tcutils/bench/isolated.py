"""Contenders timed in processes of their own, each stopped while another one runs.

Timed in turns inside one process, runtimes at more than one thread are not
measured fairly: onnxruntime's, OpenVINO's and TVM's worker threads keep
spinning for a while after a run and take the cores of the next contender
(ResNet-50 at 2 threads: onnxruntime 42.8 ms against 22 ms at 1 thread). Here
every contender lives in a worker process (``python -m
tvm_tcutils.bench.isolated``) that holds its loaded model; the parent keeps every
worker stopped (``SIGSTOP``) except the one whose turn it is, so no other
contender's thread can run while one is timed -- the kernel does not schedule
a stopped process's threads. A worker dies with its parent. Every runtime's
threads are pinned one per CPU, as TVM and OpenVINO pin theirs by default
(onnxruntime's are pinned too: unpinned, its two threads at times shared one
core for whole runs after the process had been stopped and continued).

An :class:`Isolated` is a timer as :func:`~tvm_tcutils.bench.competitors.compare`
takes them (one sample in ms per call), so the turns, the statistics and the
ratios are those of every other benchmark. The contender kinds are
:data:`KINDS`:

============  ===============================================  =====================================
kind          ``path``                                         timed by
============  ===============================================  =====================================
``tvm``       a library from ``lib.export_library``            :func:`.competitors.relay_module`
``ort``       an ONNX file (onnxruntime, CPU provider)         :func:`.competitors.onnx_session`
``openvino``  an ONNX file (OpenVINO's CPU plugin)             :func:`.competitors.openvino_file`
============  ===============================================  =====================================

Examples
--------
>>> import os, tempfile, numpy as np
>>> from tvm_tcutils.models import onnx_model
>>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
>>> model = onnx_model("mobilenet-v2-onnx"); import onnx; onnx.save(model, path)
>>> feed = {"input": np.zeros((1, 3, 224, 224), "float32")}
>>> with Isolated("ort", path, feed, threads=1, min_ms=1) as ort:
...     ort() > 0, ort.state()
(True, 'T')
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Dict, Mapping, Optional

import numpy as np

from ..processes import hold, release

#: Contender kinds a worker can load.
KINDS = ("tvm", "ort", "openvino")

#: Marks the worker's own lines on its stdout (libraries may print there too).
_REPLY = "@@tcutils-isolated "


class Isolated:
    """One contender in a worker process of its own, stopped between its turns.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    path : str
        What the worker loads: an exported TVM library or an ONNX file.
    inputs : mapping
        Input name -> array, set once in the worker.
    threads : int
        Threads the contender's runtime uses (``TVM_NUM_THREADS``, onnxruntime's intra-op
        threads, OpenVINO's ``INFERENCE_NUM_THREADS``).
    repeat, min_ms : int, float
        Per sample, the median of ``repeat`` runs, each long enough (``min_ms``) for the clock.
    start_timeout_s : float
        How long loading (and an OpenVINO compile) may take.

    Raises
    ------
    ValueError
        An unknown ``kind``, ``threads`` < 1, or a ``path`` that is not a file.
    RuntimeError
        The worker could not load the contender (its message says why).
    """

    def __init__(self, kind: str, path: str, inputs: Mapping[str, np.ndarray], threads: int = 1,
                 repeat: int = 3, min_ms: float = 100.0, start_timeout_s: float = 600.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if not os.path.isfile(path):
            raise ValueError(f"path {path!r} is not a file")
        self.kind, self.path, self.threads = kind, path, threads
        self._folder = tempfile.mkdtemp(prefix="tcutils-isolated-")
        feeds = os.path.join(self._folder, "inputs.npz")
        np.savez(feeds, **{name: np.asarray(value) for name, value in inputs.items()})
        spec = {"kind": kind, "path": os.path.abspath(path), "inputs": feeds, "threads": threads,
                "repeat": repeat, "min_ms": min_ms, "parent": os.getpid()}
        env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tvm_tcutils.bench.isolated", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        try:
            self._reply(start_timeout_s)
        except BaseException:
            self.close()
            raise
        self._stop()

    def _stop(self) -> None:
        """Stop the worker until its turn (:func:`~tvm_tcutils.processes.hold`)."""
        try:
            hold(self._process)
        except RuntimeError:
            raise RuntimeError(f"{self.kind} worker for {self.path} ended instead of stopping") from None

    def _reply(self, timeout_s: Optional[float] = None) -> dict:
        """The worker's next reply (other lines on its stdout are passed through to ours)."""
        import select

        stream = self._process.stdout
        while True:
            if timeout_s is not None and not select.select([stream], [], [], timeout_s)[0]:
                raise RuntimeError(f"{self.kind} worker for {self.path} did not answer in {timeout_s:.0f} s")
            line = stream.readline()
            if not line:
                code = self._process.wait()
                raise RuntimeError(f"{self.kind} worker for {self.path} exited ({code}) before answering")
            if line.startswith(_REPLY):
                reply = json.loads(line[len(_REPLY):])
                if "error" in reply:
                    raise RuntimeError(f"{self.kind} worker for {self.path}: {reply['error']}")
                return reply
            sys.stdout.write(line)

    def __call__(self) -> float:
        """One sample (ms): the worker runs alone, then is stopped again."""
        release(self._process)
        try:
            self._process.stdin.write("time\n")
            self._process.stdin.flush()
            return float(self._reply()["ms"])
        finally:
            if self._process.poll() is None:
                self._stop()

    def state(self) -> str:
        """The worker's scheduler state from ``/proc`` (``"T"``: stopped), ``""`` once it is gone."""
        try:
            with open(f"/proc/{self._process.pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return ""

    def close(self) -> None:
        """End the worker (it finishes nothing: it only waits for turns) and remove its files."""
        process = getattr(self, "_process", None)
        if process is not None and process.poll() is None:
            process.kill()  # delivered to a stopped process too
            process.wait()
        if process is not None:
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
        if hasattr(self, "_folder"):
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> "Isolated":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()


# --------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------
def _timer(spec: dict) -> Callable[[], float]:
    """The contender's sample timer, built in the worker from its ``spec``."""
    from . import competitors

    feeds: Dict[str, np.ndarray] = dict(np.load(spec["inputs"]))
    repeat, min_ms, threads, path = spec["repeat"], spec["min_ms"], spec["threads"], spec["path"]
    if spec["kind"] == "tvm":
        import tvm

        return competitors.relay_module(None, lib=tvm.runtime.load_module(path), inputs=feeds, repeat=repeat,
                                        warmup=1, min_repeat_ms=int(min_ms))
    if spec["kind"] == "ort":
        return competitors.onnx_session(competitors.ort_session(path, threads, pinned=True), feeds, repeat=repeat,
                                        min_ms=min_ms)
    return competitors.openvino_file(path, feeds, threads, repeat=repeat, min_ms=min_ms, pinned=True)


def _send(reply: dict) -> None:
    sys.stdout.write(_REPLY + json.dumps(reply) + "\n")
    sys.stdout.flush()


def _worker(spec: dict) -> None:
    from ..processes import die_with_parent, unpin

    die_with_parent(spec["parent"])
    unpin()
    try:
        timer = _timer(spec)
    except Exception as err:  # noqa: BLE001 -- any load failure goes back to the parent as its message
        _send({"error": f"{type(err).__name__}: {err}"})
        return
    _send({"ready": True})
    for line in sys.stdin:
        if line.strip() == "time":
            _send({"ms": timer()})


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
