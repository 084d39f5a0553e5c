"""What every benchmark script shares: the models, the contenders, the tables and the JSON results.

``scripts/bench_*.py`` are thin entry points over this package: each parses
its flags, asks :mod:`.competitors` for timers of its contenders, times them in
turns through :mod:`tvm_tcutils.measure`, prints a table (:mod:`.table`) and
writes the same rows as JSON (:mod:`.results`), so that docs and plots come
from data, not from pasted output.

Modules: :mod:`.results`, :mod:`.table`, :mod:`.competitors`, :mod:`.models`
(benchmark models), :mod:`.workloads` (TVM-only workloads a child process
without the package can load), :mod:`.collage` (Collage's synthetic toolchains
and costs), :mod:`.int8` (the int8 dot-product benchmark's contenders), :mod:`.collage_memory`
(peak process-tree memory of a measured Collage search).

Examples
--------
>>> from tvm_tcutils.bench import results, table
>>> print(table.markdown(["model", "ms"], [["mlp", "0.02"]]))
| model | ms |
|---|---|
| mlp | 0.02 |
"""
