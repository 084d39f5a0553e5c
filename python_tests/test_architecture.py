"""The package's shape, checked statically: no import cycles, capabilities apart, one registry writer.

Every ``.py`` under ``tvm_tcutils/`` is parsed (never imported) and every
``import`` statement in it counts, at module level or inside a function: a
function-level import breaks a cycle only at import time, the modules still
depend on each other. Imports under ``if TYPE_CHECKING:`` do not run and do not
count. ``importlib.import_module("tvm_tcutils....")`` with a string (the hook
table in ``registry.HOOK_PROVIDERS``, the sections of ``demo.SECTIONS``, the
subcommand table of ``cli.COMMANDS``) is deliberate late binding and is not an
import statement, so it does not count either.

Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those
implicit edges are left out, otherwise every module would form a cycle with the
package's ``__init__`` that imports the registry.
"""
from __future__ import annotations

import ast
import functools
import os
from collections import defaultdict
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tvm_tcutils"

#: The capability packages: none of them may import another.
CAPABILITIES = ("tensorcore", "dotprod", "collage")

#: Modules outside the capabilities that wire them together and so may import them
#: (a prefix entry covers the modules below it). ``tvm_tcutils`` itself re-exports
#: the tensor-core API as the package's public names; ``bench`` runs each capability's
#: benchmarks for the scripts.
WIRING = ("tvm_tcutils", "tvm_tcutils.demo", "tvm_tcutils.cli", "tvm_tcutils.commands", "tvm_tcutils.registry",
          "tvm_tcutils.bench")

#: The one module that writes into TVM's registries.
REGISTRY_WRITER = "tvm_tcutils.registry"

#: Calls that write into a TVM registry (by the called attribute's or function's name).
REGISTRY_CALLS = frozenset({
    "register_func", "set_attr", "reset_attr", "register_pattern_table", "register_topi_compute",
    "register_topi_schedule", "register_op_attr", "register_strategy", "register_legalize",
    "register_alter_op_layout", "register_convert_op_layout", "register_injective_schedule",
})

#: Methods that change a dict in place (for ``TASK_TABLE``).
MUTATING_METHODS = frozenset({"pop", "popitem", "update", "setdefault", "clear", "__setitem__", "__delitem__"})

#: The environment variable whose default the package sets, and the one module that sets it.
TOPHUB_NAME, TOPHUB_OWNER = "TOPHUB_LOCATION", "tvm_tcutils._tvm"


def _sources() -> Dict[str, Tuple[str, bool]]:
    """Dotted module name -> (file path, is a package ``__init__``), for every module of the package."""
    found = {}
    for folder, dirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, ROOT)[: -len(".py")].split(os.sep)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_package)
    return found


SOURCES = _sources()


@functools.lru_cache(maxsize=None)
def _trees() -> Dict[str, ast.AST]:
    """Module -> its parsed source. Parsed on first use, not at import: every pytest worker imports this file
    to collect it (a second of parsing each), and only the one that runs these tests needs the trees."""
    return {name: ast.parse(open(path, encoding="utf-8").read(), path) for name, (path, _) in SOURCES.items()}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _known(name: str) -> Optional[str]:
    """The longest prefix of the dotted ``name`` that is a module of the package, or ``None``."""
    while name:
        if name in SOURCES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> Iterator[Tuple[str, int]]:
    """(imported module of the package, line) for every import statement in ``module``."""
    is_package = SOURCES[module][1]
    here = module if is_package else module.rpartition(".")[0]
    for node in _runtime_nodes(_trees()[module]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name)
                if target:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not _known(base):
                continue
            for alias in node.names:
                # ``from pkg import name``: a submodule when one is called so, else a name in pkg.
                target = _known(f"{base}.{alias.name}")
                yield (target if target and target != _known(base) else _known(base)), node.lineno


@functools.lru_cache(maxsize=None)
def _graph() -> Dict[str, Dict[str, int]]:
    """module -> {imported module: line of its first import}, without self-imports (built on first use)."""
    graph: Dict[str, Dict[str, int]] = defaultdict(dict)
    for module in SOURCES:
        graph[module]
        for target, line in _imports(module):
            if target != module:
                graph[module][target] = min(line, graph[module].get(target, line))
    return graph



def _strongly_connected(graph: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """Tarjan's strongly connected components of more than one module (iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    found: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _cycle_in(component: List[str]) -> List[str]:
    """One cycle through the first module of a strongly connected ``component`` (shortest, by BFS)."""
    members = set(component)
    start = component[0]
    parents: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(_graph()[node]):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return component


def _describe(cycle: List[str]) -> str:
    steps = [f"{a} (line {_graph()[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def _capability(module: str) -> Optional[str]:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in CAPABILITIES else None


def _is_wiring(module: str) -> bool:
    return any(module == w or (w != PACKAGE and module.startswith(w + ".")) for w in WIRING)


def test_the_walk_sees_the_package():
    # Guards the checks below against passing on an empty or unresolved graph.
    assert {"tvm_tcutils._tvm", "tvm_tcutils.registry", "tvm_tcutils.collage.driver"} <= set(SOURCES)
    assert "tvm_tcutils._tvm" in _graph()["tvm_tcutils.native"] or "tvm_tcutils._tvm" in _graph()["tvm_tcutils.registry"]
    assert any(_capability(t) for deps in _graph().values() for t in deps)


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = [_describe(_cycle_in(component)) for component in _strongly_connected(_graph())]
    assert not cycles, "import cycles in the package:\n  " + "\n  ".join(cycles)


def test_capabilities_do_not_import_each_other():
    crossings = [
        f"{module} (line {line}) imports {target}"
        for module, deps in sorted(_graph().items()) for target, line in sorted(deps.items())
        if _capability(module) and _capability(target) and _capability(module) != _capability(target)
    ]
    assert not crossings, "a capability imports another:\n  " + "\n  ".join(crossings)


def test_core_modules_do_not_import_capabilities():
    crossings = [
        f"{module} (line {line}) imports {target}"
        for module, deps in sorted(_graph().items()) for target, line in sorted(deps.items())
        if not _capability(module) and not _is_wiring(module) and _capability(target)
    ]
    assert not crossings, "a core module imports a capability:\n  " + "\n  ".join(crossings)


def test_commands_do_not_import_the_cli():
    # cli loads every subcommand (by name, from cli.COMMANDS): a subcommand importing cli back is a
    # cycle the static graph cannot see. What they share is in commands._common.
    back = [
        f"{module} (line {line}) imports {target}"
        for module, deps in sorted(_graph().items()) if module.startswith("tvm_tcutils.commands.")
        for target, line in sorted(deps.items()) if target == "tvm_tcutils.cli"
    ]
    assert not back, "a subcommand imports the cli (use tvm_tcutils.commands._common):\n  " + "\n  ".join(back)


def _called_name(call: ast.Call) -> Optional[str]:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _names_task_table(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "TASK_TABLE") or (
        isinstance(node, ast.Name) and node.id == "TASK_TABLE")


def _registry_writes(module: str) -> Iterator[Tuple[int, str]]:
    for node in _runtime_nodes(_trees()[module]):
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in REGISTRY_CALLS:
                yield node.lineno, f"{name}(...)"
            elif (name in MUTATING_METHODS and isinstance(node.func, ast.Attribute)
                  and _names_task_table(node.func.value)):
                yield node.lineno, f"TASK_TABLE.{name}(...)"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if _names_task_table(target) or (isinstance(target, ast.Subscript) and _names_task_table(target.value)):
                    yield node.lineno, "TASK_TABLE write"


def test_writer_check_sees_writes():
    assert list(_registry_writes(REGISTRY_WRITER)), "the check finds nothing in registry.py: it is broken"


def test_only_registry_writes_tvm_registries():
    writes = [
        f"{SOURCES[module][0]}:{line}: {what}"
        for module in sorted(SOURCES) if module != REGISTRY_WRITER
        for line, what in sorted(_registry_writes(module))
    ]
    assert not writes, f"only {REGISTRY_WRITER} may write into TVM's registries:\n  " + "\n  ".join(writes)


def _docstrings(tree: ast.AST) -> Set[int]:
    """ids of the docstring constants of ``tree`` (a mention in prose is not a definition)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_tophub_default_is_set_in_one_place():
    holders = []
    for module, tree in sorted(_trees().items()):
        skip = _docstrings(tree)
        lines = [node.lineno for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and TOPHUB_NAME in node.value and id(node) not in skip]
        holders.extend(f"{SOURCES[module][0]}:{line}" for line in lines if module != TOPHUB_OWNER)
        if module == TOPHUB_OWNER:
            assert lines, f"{TOPHUB_OWNER} no longer names {TOPHUB_NAME}: move this check with it"
    assert not holders, f"{TOPHUB_NAME} is named outside {TOPHUB_OWNER}:\n  " + "\n  ".join(holders)
