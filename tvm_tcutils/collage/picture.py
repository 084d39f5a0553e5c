"""The picture of a Collage result: Graphviz dot with a legend, costs, and repeated blocks drawn once.

Each chosen partition is one box, filled with its toolchain's colour, headed
by the toolchain (in words) and its estimated ms, listing its operators.
Boxes run left to right (``rankdir=LR``); a long model wraps into columns of
:data:`COLUMN` boxes, read top to bottom, so that the picture stays about a
screen in size. Consecutive blocks of partitions with the same structure (the
same toolchains and operator sequences: the layers of a transformer) are
drawn once, framed and marked ``xN``. A legend has one coloured swatch per
toolchain used, with its partition count and total estimated ms; the title
gives the total estimate and, when known, the whole module measured.
"""
from __future__ import annotations

import collections
import dataclasses
import html
import math
import shutil
import subprocess
from typing import Dict, List, Sequence, Tuple

from .driver import CollageResult
from .subgraph import bits

#: Fill colours by toolchain (others cycle through :data:`EXTRA_COLOURS`).
COLOURS = {"tvm": "#9ecae1", "tvm-fastmath": "#6baed6", "ort": "#fdae6b", "openvino": "#c994c7",
           "openvino-bf16": "#df65b0", "blas": "#a1d99b", "host": "#eeeeee"}
EXTRA_COLOURS = ("#bcbddc", "#fc9272", "#fdd0a2", "#c7e9c0", "#dadaeb")

#: Toolchain names in words, for headers and the legend (others are shown as named).
WORDS = {"tvm": "TVM", "tvm-fastmath": "TVM (fast math)", "ort": "onnxruntime", "openvino": "OpenVINO",
         "openvino-bf16": "OpenVINO (bf16)", "blas": "BLAS", "host": "host glue"}

#: Boxes per column once a model has more boxes than this (fewer: one row, left to right).
COLUMN = 6

#: The longest side of a rendered picture, in inches (at 96 dpi, 1920 px): Graphviz scales larger drawings down.
SIZE_INCHES = 20

#: Operator lines in a box; a longer partition lists its operators by count instead of in order.
OP_LINES = 6

#: Longest block of partitions looked for when collapsing repeats (bounds the search's time).
MAX_PERIOD = 64


@dataclasses.dataclass
class _Box:
    """One drawn partition: the representative of ``len(masks)`` identical ones (a repeated block's)."""

    key: str
    toolchain: str
    ops: Tuple[str, ...]
    costs: List[float]
    masks: List[int]
    group: int  # index of its repeat group, -1 when drawn once


def repeats(seq: Sequence, max_period: int = MAX_PERIOD) -> List[Tuple[int, int, int]]:
    """Cover ``seq`` with ``(start, period, count)`` runs: ``seq[start:start+period]`` repeated ``count`` times.

    Greedy from the left: at each position the run covering the most items
    wins (ties: the shorter period); a position no run covers is ``(i, 1, 1)``.

    Examples
    --------
    >>> repeats("xabababy")
    [(0, 1, 1), (1, 2, 3), (7, 1, 1)]
    >>> repeats("aaaa")
    [(0, 1, 4)]
    """
    out, i, n = [], 0, len(seq)
    items = list(seq)
    while i < n:
        period, count = 1, 1
        for p in range(1, min(max_period, (n - i) // 2) + 1):
            r = 1
            while i + (r + 1) * p <= n and items[i + r * p:i + (r + 1) * p] == items[i:i + p]:
                r += 1
            if r > 1 and p * r > period * count:
                period, count = p, r
        out.append((i, period, count))
        i += period * count
    return out


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else ("failed" if math.isinf(value) else f"{value:.3f} ms")


def _chosen_costs(result: CollageResult) -> List[float]:
    """Estimated ms of each chosen candidate (host glue: 0; unknown: nan)."""
    non_host = [c for c in result.chosen if not c.host]
    by_order = [p.estimated_ms for p in result.partitions]
    if len(by_order) != len(non_host) or any(p.toolchain != c.toolchain
                                              for p, c in zip(result.partitions, non_host)):
        by_order = [math.nan] * len(non_host)  # the partitions listed are not the chosen ones
    costs = iter(by_order)
    return [0.0 if c.host else next(costs) for c in result.chosen]


def _boxes(result: CollageResult) -> Tuple[List[_Box], List[Tuple[int, int]]]:
    """The boxes to draw, and the repeat groups as (first box, box count, repetitions)."""
    graph = result.graph
    chosen = result.chosen
    costs = _chosen_costs(result)
    names = ["host" if c.host else c.toolchain for c in chosen]
    shapes = [(name, tuple(graph.op_names(c.mask))) for name, c in zip(names, chosen)]
    boxes: List[_Box] = []
    groups: List[Tuple[int, int, int]] = []
    for start, period, count in repeats(shapes):
        group = len(groups) if count > 1 else -1
        if count > 1:
            groups.append((len(boxes), period, count))
        for j in range(period):
            members = [start + r * period + j for r in range(count)]
            name, ops = shapes[members[0]]
            boxes.append(_Box(f"p{members[0]}", name, ops, [costs[m] for m in members],
                              [chosen[m].mask for m in members], group))
    return boxes, groups


def _op_lines(ops: Tuple[str, ...]) -> List[str]:
    """A box's operator lines: in order (runs merged) when they fit, else by count."""
    runs: List[List] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    if len(runs) > OP_LINES:
        runs = [list(pair) for pair in collections.Counter(ops).most_common()]
        if len(runs) > OP_LINES:
            rest = sum(n for _, n in runs[OP_LINES - 1:])
            runs = runs[:OP_LINES - 1] + [[f"{len(runs) - OP_LINES + 1} other kinds", rest]]
    return [op + (f" x{n}" if n > 1 else "") for op, n in runs]


def _colour(toolchain: str, extra: Dict[str, str]) -> str:
    if toolchain in COLOURS:
        return COLOURS[toolchain]
    if toolchain not in extra:
        extra[toolchain] = EXTRA_COLOURS[len(extra) % len(EXTRA_COLOURS)]
    return extra[toolchain]


def _words(toolchain: str) -> str:
    return WORDS.get(toolchain, toolchain)


def _box_node(box: _Box, colour: str) -> str:
    n = len(box.costs)
    each = sum(box.costs) / n
    cost = "free" if box.toolchain == "host" else _ms(each) + (" each" if n > 1 else "")
    head = f"<b>{html.escape(_words(box.toolchain))}</b> {html.escape(cost)}" + (f" x{n}" if n > 1 else "")
    count = f"{len(box.ops)} ops" if len(box.ops) != 1 else "1 op"
    rows = [head, count] + [html.escape(line) for line in _op_lines(box.ops)]
    cells = "".join(f"<tr><td>{row}</td></tr>" for row in rows)
    return (f'  {box.key} [fillcolor="{colour}", label=<<table border="0" cellborder="0" '
            f'cellspacing="0">{cells}</table>>];')


def _title(result: CollageResult, boxes: List[_Box]) -> str:
    costs = [c for box in boxes for c in box.costs if box.toolchain != "host"]
    total = sum(costs)
    parts = [f"Collage's mix: {len(costs)} partitions, estimated {_ms(total)} in total"]
    measured = result.measured_ms
    final = result.final
    if (measured is None or not math.isfinite(measured)) and final is not None and final.mix in final.timings:
        measured = final.timings[final.mix].median_ms  # the mix timed whole in the final comparison
    if measured is not None and math.isfinite(measured):
        parts.append(f"measured whole {measured:.3f} ms")
    if result.answer != "collage":
        parts.append(f"the answer is {result.answer}")
    return html.escape("; ".join(parts))


def _legend(boxes: List[_Box], colours: Dict[str, str]) -> List[str]:
    count: Dict[str, int] = collections.Counter()
    total: Dict[str, float] = collections.defaultdict(float)
    for box in boxes:
        count[box.toolchain] += len(box.costs)
        total[box.toolchain] += sum(box.costs)
    lines = ["  subgraph cluster_legend {", '    label="toolchains"; style=rounded; color=gray50; rank=same;']
    for name in sorted(count):
        cost = "free" if name == "host" else f"{_ms(total[name])} estimated"
        what = f"{_words(name)} ({name})" if _words(name) != name else name
        label = html.escape(f"{what}: {count[name]} partition{'s' * (count[name] != 1)}, {cost}")
        lines.append(f'    legend_{_ident(name)} [label="{label}", fillcolor="{colours[name]}", shape=box];')
    lines.append("  }")
    return lines


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _edges(result: CollageResult, boxes: List[_Box], groups: List[Tuple[int, int, int]]) -> List[str]:
    """Dataflow between boxes (and from the inputs); within a repeat group only inside one repetition."""
    graph = result.graph
    where: Dict[int, Tuple[str, int, int]] = {}  # node -> (box, group, repetition)
    for box in boxes:
        for rep, mask in enumerate(box.masks):
            for i in bits(mask):
                where[i] = (box.key, box.group, rep)
    edges = set()
    for node in graph.nodes:
        if node.index not in where:
            continue
        dst, group, rep = where[node.index]
        for j in set(node.inputs):
            if graph.nodes[j].kind == "var":
                edges.add((f"v{j}", dst))
            elif j in where:
                src, src_group, src_rep = where[j]
                if src != dst and not (group >= 0 and group == src_group and rep != src_rep):
                    edges.add((src, dst))
    order = {box.key: k for k, box in enumerate(boxes)}
    lines = [f"  {a} -> {b};" for a, b in sorted(edges, key=lambda e: (order.get(e[0], -1), order[e[1]], e))]
    for first, period, count in groups:  # one loop edge says the block repeats
        lines.append(f'  {boxes[first + period - 1].key} -> {boxes[first].key} [style=dashed, constraint=false, '
                     f'label="x{count}"];')
    return lines


def to_dot(result: CollageResult, column: int = COLUMN) -> str:
    """The partitioned graph in Graphviz dot: a box per partition with its cost, a legend, repeats drawn once.

    ``column``: boxes per column when there are more boxes than that.

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> text = to_dot(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False))
    >>> text.splitlines()[1], "legend_tvm" in text
    ('  rankdir=LR;', True)
    """
    if not isinstance(column, int) or column < 1:
        raise ValueError(f"column must be an integer of at least 1, got {column!r}")
    boxes, groups = _boxes(result)
    extra: Dict[str, str] = {}
    colours = {box.toolchain: _colour(box.toolchain, extra) for box in boxes}
    lines = ["digraph collage {", "  rankdir=LR;", "  newrank=true;", "  labelloc=t;",
             "  nodesep=0.15; ranksep=0.3;", f'  size="{SIZE_INCHES},{SIZE_INCHES}";',
             f"  label=<{_title(result, boxes)}>;",
             '  node [shape=box, style="rounded,filled", fontsize=10, margin="0.05,0.02"];']
    lines += _legend(boxes, colours)
    for node in result.graph.nodes:
        if node.kind == "var":
            lines.append(f'  v{node.index} [label="{html.escape(node.expr.name_hint)}", shape=ellipse, '
                         'fillcolor=white];')
    in_group = {k: g for g, (first, period, _) in enumerate(groups) for k in range(first, first + period)}
    for k, box in enumerate(boxes):
        g = in_group.get(k)
        if g is not None and k == groups[g][0]:
            first, period, count = groups[g]
            cost = sum(sum(b.costs) for b in boxes[first:first + period])
            lines.append(f"  subgraph cluster_block{g} {{")
            lines.append(f'    label="block of {period} partition{"s" * (period != 1)} x{count} '
                         f'({_ms(cost)} estimated in all)"; style="dashed,rounded"; color=gray40;')
        lines.append(("  " if g is not None else "") + _box_node(box, colours[box.toolchain]))
        if g is not None and k == groups[g][0] + groups[g][1] - 1:
            lines.append("  }")
    if len(boxes) > column:  # wrap: columns of boxes, read top to bottom, left to right
        heads = []
        for start in range(0, len(boxes), column):
            keys = [box.key for box in boxes[start:start + column]]
            heads.append(keys[0])
            lines.append("  {rank=same; " + "; ".join(keys) + ";}")
            lines += [f"  {a} -> {b} [style=invis];" for a, b in zip(keys, keys[1:])]
        lines += [f"  {a} -> {b} [style=invis];" for a, b in zip(heads, heads[1:])]
    lines += _edges(result, boxes, groups)
    lines.append("}")
    return "\n".join(lines) + "\n"


#: Picture formats Graphviz renders (others are written as dot text).
RENDERED = ("svg", "png", "pdf")


def write_picture(result: CollageResult, path: str) -> str:
    """Write ``to_dot(result)`` to ``path``; ``.svg``/``.png``/``.pdf`` are rendered with Graphviz's ``dot``.

    Returns the path written.

    Examples
    --------
    >>> import os, tempfile
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> result = partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False)
    >>> path = write_picture(result, os.path.join(tempfile.mkdtemp(), "partitions.dot"))
    >>> open(path).read().startswith("digraph")
    True
    """
    text = to_dot(result)
    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else "dot"
    if fmt in RENDERED:
        dot = shutil.which("dot")
        if dot is None:
            raise ValueError(f"--dot {path}: rendering {fmt} needs Graphviz's 'dot'; write a .dot file instead")
        subprocess.run([dot, f"-T{fmt}", "-o", path], input=text, text=True, check=True)
        return path
    with open(path, "w") as handle:
        handle.write(text)
    return path
