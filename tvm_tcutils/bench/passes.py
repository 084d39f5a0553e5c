"""The pass benchmark: tvm_tcutils' graph passes next to TVM 0.19's own, in a capped child process.

Examples
--------
>>> layers, infer_s, steps = our_steps("chain3")
>>> layers, sorted(steps) == sorted(STEPS)
(3, True)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Dict, Tuple, Union

from ..measure import time_callable
from .competitors import timed_once
from .workloads import STEPS, WORKLOADS, best_of, workload  # noqa: F401

_WORKLOADS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads.py")

# The child: TVM alone. Prints one JSON line per finished step, so that a step that runs past
# the cap still leaves the earlier ones. TVM's Python passes recurse: a high recursion limit and
# a thread with a 1 GiB stack give them their best chance.
_CHILD = r"""
import json, runpy, sys, threading, time
sys.setrecursionlimit(10**7)
threading.stack_size(1 << 30)
import tvm
from tvm import relay
W = runpy.run_path(sys.argv[3])  # by path: the package (and its hooks) stays out of this process

NAME, STEP = sys.argv[1], sys.argv[2]

def convert(mod):
    with relay.transform.LayoutConfig(skip_layers=[0]), tvm.transform.PassContext(opt_level=3):
        return relay.transform.ConvertLayout({"nn.conv2d": ["HWNC", "default"]})(mod)

STEPS = {
    "count_layers": lambda mod: relay.analysis.count_layers(mod, ["nn.conv2d"]),
    "recast": lambda mod: relay.transform.recast(mod, "int8", "int32", skip_layers=[0]),
    "convert_layout": convert,
    "prepare": lambda mod: relay.transform.recast(convert(mod), "int4", "int32", skip_layers=[0]),
}

def seconds_of(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start

def main():
    mod = relay.transform.InferType()(W["workload"](NAME))
    try:
        print(json.dumps({STEP: W["best_of"](lambda: STEPS[STEP](mod), seconds_of)}), flush=True)
    except RecursionError:
        print(json.dumps({STEP: "RecursionError"}), flush=True)

thread = threading.Thread(target=main)
thread.start()
thread.join()
"""


def seconds_of(run: Callable[[], object]) -> float:
    """Seconds of one call of ``run`` (:func:`~tvm_tcutils.measure.time_callable`, no warm-up).

    Examples
    --------
    >>> seconds_of(lambda: None) >= 0
    True
    """
    return time_callable(run, repeat=1, warmup=0).median_ms / 1e3


def tvm_seconds(name: str, step: str, cap: float) -> Union[float, str]:
    """Seconds TVM's version of ``step`` takes in a child process, or why there is no time."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, name, step, _WORKLOADS_FILE],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = proc.communicate(timeout=cap)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"> {cap:.0f} (stopped)"
    for line in out.splitlines():
        if line.startswith("{"):
            return json.loads(line)[step]
    return f"crashed (status {proc.returncode})"


def our_steps(name: str) -> Tuple[int, float, Dict[str, Callable[[], object]]]:
    """(conv2d layers, InferType seconds, {step: callable}) for tvm_tcutils' passes."""
    from .._tvm import tvm
    from tvm import relay

    from ..tensorcore import LayoutConfig, count_layers, prepare_for_tensorcore, recast

    untyped = workload(name)
    mod, infer = timed_once(lambda: relay.transform.InferType()(untyped))

    def convert():
        with LayoutConfig(skip_layers=[0]), tvm.transform.PassContext(opt_level=3):
            return relay.transform.ConvertLayout({"nn.conv2d": ["HWNC", "default"]})(mod)

    steps = {
        "count_layers": lambda: count_layers(mod, ["nn.conv2d"]),
        "recast": lambda: recast(mod, "int8", "int32", skip_layers=[0]),
        "convert_layout": convert,
        "prepare": lambda: prepare_for_tensorcore(mod, "int4", skip_layers=[0]),
    }
    return count_layers(mod, ["nn.conv2d"]), infer, steps


def compare_step(name: str, step: str, ours: Callable[[], object], cap: float) -> dict:
    """Ours then TVM's version of one step, back to back so that both see the same machine load."""
    mine = best_of(ours, seconds_of)
    theirs = tvm_seconds(name, step, cap)
    return {"workload": name, "step": step, "ours_s": mine, "tvm_s": theirs,
            "tvm_over_ours": theirs / mine if isinstance(theirs, float) else None}
