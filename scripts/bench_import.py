#!/usr/bin/env python
"""What a process pays to start with the package, by ml_dtypes version: `import tvm_tcutils`, `tvm-tcutils --help`.

Every process that imports TVM imports ml_dtypes (TVM's dtype table; onnx's too): the CLI, the RPC
servers, AutoTVM's build and run workers, Collage's measuring workers. Each contender is a fresh
interpreter of this environment, with the installed ml_dtypes or with another version put first on
``PYTHONPATH`` (``pip install --no-deps --target``, cached in ``tvm_tcutils.files.cache_dir("ml_dtypes")``;
needs PyPI once per version). A sample is the wall time of one such process, start to exit; the
contenders take turns (``tvm_tcutils.measure.interleave``), ``--rounds`` rounds, medians and ratios
with their bootstrap interval (below 1: faster than the installed version). One process runs at a time.

    PYTHONPATH=. python scripts/bench_import.py --versions 0.7.0 0.6.0 0.5.4
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.competitors import compare, python_call, ratios  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.files import cache_dir  # noqa: E402

CACHE = cache_dir("ml_dtypes")

#: What each workload runs in the fresh interpreter.
WORKLOADS = {
    "import tvm_tcutils": ["-c", "import tvm_tcutils"],
    "tvm-tcutils --help": ["-m", "tvm_tcutils", "--help"],
}


def _version_dir(version: str) -> str:
    """A folder holding ml_dtypes ``version`` alone, installed once (into a temporary folder, then renamed)."""
    final = os.path.join(CACHE, version)
    if os.path.isfile(os.path.join(final, "ml_dtypes", "__init__.py")):
        return final
    os.makedirs(CACHE, exist_ok=True)
    work = tempfile.mkdtemp(dir=CACHE, prefix=f".{version}-")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", work,
                           f"ml_dtypes=={version}"], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit(f"--versions {version}: pip could not install ml_dtypes=={version}: "
                         f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    os.replace(work, final)
    return final


def _env(path: str | None) -> dict:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, root, os.environ.get("PYTHONPATH")]))
    return env


def _check(env: dict, version: str) -> None:
    """The interpreter with ``env`` imports ml_dtypes ``version`` (else the ratio would compare nothing)."""
    got = subprocess.run([sys.executable, "-c", "import ml_dtypes; print(ml_dtypes.__version__)"], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    if got != version:
        raise SystemExit(f"--versions {version}: the interpreter imported ml_dtypes {got} instead")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=["0.7.0"], metavar="VERSION",
                        help="ml_dtypes versions to time beside the installed one (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=9)
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (a ratio's interval needs two samples)")
    installed = metadata.version("ml_dtypes")
    baseline = f"installed {installed}"
    envs = {baseline: _env(None)}
    _check(envs[baseline], installed)
    for version in args.versions:
        if version != installed:
            envs[version] = _env(_version_dir(version))
            _check(envs[version], version)
    results = Results(__file__, argv, rounds=args.rounds, python=sys.version.split()[0],
                      numpy=metadata.version("numpy"), installed_ml_dtypes=installed)
    print(f"one fresh process a sample, median of {args.rounds} rounds in turns; ratio: time / {baseline}'s")
    print(f"{'workload':20s} {'ml_dtypes':18s} {'median s':>9s} {'ratio':>24s}")
    for workload, tail in WORKLOADS.items():
        timers = {label: python_call(lambda env=env: subprocess.run([sys.executable, *tail], env=env, check=True,
                                                                     stdout=subprocess.DEVNULL), repeat=1)
                  for label, env in envs.items()}
        timed = compare(timers, args.rounds)
        against = ratios(timed, baseline)
        for label, timing in timed.items():
            r = against[label]
            print(f"{workload:20s} {label:18s} {timing.median_ms / 1e3:9.2f} "
                  f"{'x%.2f [%.2f, %.2f]' % (r.value, r.low, r.high):>24s}")
            results.add(workload=workload, ml_dtypes=label, timing=timing, ratio=r)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
