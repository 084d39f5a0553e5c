"""Reports of a Collage result: the partition table and a Graphviz picture."""
from __future__ import annotations

import shutil
import subprocess
from typing import Dict, List

from .driver import CollageResult
from .subgraph import bits

#: Fill colours by toolchain (others cycle through :data:`_EXTRA`).
COLOURS = {"tvm": "#9ecae1", "tvm-fastmath": "#6baed6", "ort": "#fdae6b", "blas": "#a1d99b", "host": "#eeeeee"}
_EXTRA = ["#bcbddc", "#fc9272", "#fdd0a2", "#c7e9c0", "#dadaeb"]


def partition_table(result: CollageResult, limit: int = 8) -> List[str]:
    """Lines of a table of the chosen partitions: index, toolchain, estimated ms, ops, function.

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> lines = partition_table(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0})))
    >>> lines[0].split()[:3]
    ['#', 'toolchain', 'est.']
    """
    lines = [f"{'#':>3}  {'toolchain':<10} {'est. ms':>9}  {'function':<34} ops"]
    for k, row in enumerate(result.partitions):
        ops = "+".join(row.ops[:limit]) + (f"+...({len(row.ops)} ops)" if len(row.ops) > limit else "")
        lines.append(f"{k:>3}  {row.toolchain:<10} {row.estimated_ms:>9.4f}  {row.function or '(in main)':<34} {ops}")
    return lines


def _colour(toolchain: str, extra: Dict[str, str]) -> str:
    if toolchain in COLOURS:
        return COLOURS[toolchain]
    if toolchain not in extra:
        extra[toolchain] = _EXTRA[len(extra) % len(_EXTRA)]
    return extra[toolchain]


def to_dot(result: CollageResult) -> str:
    """The partitioned graph in Graphviz dot: one cluster per partition, coloured by toolchain.

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> to_dot(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}))).startswith("digraph")
    True
    """
    graph = result.graph
    extra: Dict[str, str] = {}
    lines = ["digraph collage {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontsize=10];']
    owner = {}
    for k, cand in enumerate(result.chosen):
        for i in bits(cand.mask):
            owner[i] = (k, cand)
    for k, cand in enumerate(result.chosen):
        toolchain = "host" if cand.host else cand.toolchain
        colour = _colour(toolchain, extra)
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f'    label="{toolchain} #{k}"; style=dashed; color="{colour}";')
        for i in bits(cand.mask):
            lines.append(f'    n{i} [label="{graph.nodes[i].op_name}", fillcolor="{colour}"];')
        lines.append("  }")
    for node in graph.nodes:
        if node.kind == "var":
            lines.append(f'  n{node.index} [label="{node.expr.name_hint}", shape=ellipse, fillcolor=white];')
    for node in graph.nodes:
        if node.kind == "const" or node.index not in owner and node.kind != "var":
            continue
        for j in sorted(set(node.inputs)):
            if graph.nodes[j].kind != "const":
                lines.append(f"  n{j} -> n{node.index};")
    lines.append("  legend [shape=plaintext, label=\"" + "  ".join(
        f"{name}: {colour}" for name, colour in sorted({**COLOURS, **extra}.items())) + "\"];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_picture(result: CollageResult, path: str) -> str:
    """Write ``to_dot(result)`` to ``path``; ``.svg``/``.png`` are rendered with Graphviz when installed.

    Returns the path written (the ``.dot`` text is kept next to it when rendering).

    Examples
    --------
    >>> write_picture(result, "partitions.dot")  # doctest: +SKIP
    'partitions.dot'
    """
    text = to_dot(result)
    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else "dot"
    if fmt in ("svg", "png", "pdf"):
        dot = shutil.which("dot")
        if dot is None:
            raise ValueError(f"--dot {path}: rendering {fmt} needs Graphviz's 'dot'; write a .dot file instead")
        subprocess.run([dot, f"-T{fmt}", "-o", path], input=text, text=True, check=True)
        return path
    with open(path, "w") as handle:
        handle.write(text)
    return path
