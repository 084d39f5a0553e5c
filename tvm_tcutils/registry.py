"""The one place that writes into TVM's registries.

Every hook tvm-tcutils adds to TVM (op strategies, ``FTVMAlterOpLayout``,
``FTVMLegalize``, ``FTVMConvertOpLayout``, other op attributes, AutoTVM
templates, packed functions, pattern tables) is *declared* by a feature module
as a plain :class:`Hook` value and *applied* here, by :func:`register`.

Rules this module enforces:

* Op attributes are installed at an explicit level above TVM's own (TVM uses
  10; we use :data:`LEVEL` unless a hook says otherwise).
* Every op-attribute hook wraps the attribute it replaces and delegates to it
  for every case it does not handle (its ``handler`` returns ``None``, or the
  current target's keys are not among the hook's ``targets``).
* Several features may hook the same attribute of the same op (say the CUDA
  tensor-core and the x86 dot-product strategies of ``nn.conv2d``): their
  handlers are tried in declaration order before TVM's original, and their
  strategy tables are merged.
* Registration is idempotent: importing twice, ``importlib.reload`` and calling
  :func:`register` again never raise "already registered"; the originals TVM
  had are remembered across reloads so that wrappers never wrap wrappers.
* :func:`unregister` restores exactly what TVM had before.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import tvm
from tvm import autotvm, relay

logger = logging.getLogger("tvm_tcutils.registry")

#: Level used for op attributes; TVM registers its own at 10.
LEVEL = 20

#: Modules whose ``hooks()`` function returns the package's hook declarations.
#: One module per capability (and nowhere else registers anything); their
#: handlers for a shared slot are tried in this order.
HOOK_PROVIDERS: Tuple[str, ...] = (
    "tvm_tcutils.tensorcore.hooks",
    "tvm_tcutils.collage.hooks",
    "tvm_tcutils.dotprod.hooks",
)

#: Attributes whose handlers share the ``(attrs, inputs, types, extra)`` calling
#: convention and whose "no change" answer is ``None``.
_LAYOUT_ATTRS = ("FTVMAlterOpLayout", "FTVMLegalize", "FTVMConvertOpLayout", "FTVMQnnLegalize",
                 "FTVMQnnCanonicalize")

#: Kinds whose registry entry holds exactly one value.
_SINGLE_SLOT_KINDS = ("relay_op", "autotvm_template", "packed_func", "pattern_table")


@dataclasses.dataclass(frozen=True)
class StrategyImpl:
    """One row of a strategy table: an implementation and when it applies.

    Parameters
    ----------
    name : str
        Implementation name, as reported by ``select_implementation``.
    fcompute, fschedule : callable
        Relay-level compute ``(attrs, inputs, out_type) -> [Tensor]`` and
        schedule ``(attrs, outs, target) -> Schedule`` (as produced by
        ``relay.op.strategy.wrap_compute_*`` / ``wrap_topi_schedule``).
    applies : callable
        ``(attrs, inputs, out_type, target) -> bool``; only rows that apply are
        added.
    plevel : int
        Priority among implementations; TVM's own use 5-15.
    exclusive : bool
        When true and the row applies, TVM's implementations are dropped: used
        to take over a TVM path that crashes or computes wrong results.
    """

    name: str
    fcompute: Callable
    fschedule: Callable
    applies: Callable[..., bool]
    plevel: int = 25
    exclusive: bool = False


@dataclasses.dataclass(frozen=True)
class Hook:
    """A declaration of one thing to install into TVM.

    ``kind`` is one of ``"relay_op"``, ``"op_attr"``, ``"strategy"``, ``"autotvm_template"``,
    ``"packed_func"`` and ``"pattern_table"``; build hooks with the helper
    functions :func:`relay_op`, :func:`op_attr`, :func:`strategy`, :func:`autotvm_template`,
    :func:`packed_func` and :func:`pattern_table` rather than by hand.
    """

    kind: str
    name: str
    attr: str = ""
    level: int = LEVEL
    targets: Optional[Tuple[str, ...]] = None
    payload: Any = None
    description: str = ""

    @property
    def slot(self) -> Tuple[str, str, str]:
        """The TVM registry entry this hook writes: several hooks may share one."""
        return (self.kind, self.name, self.attr)

    @property
    def key(self) -> Tuple[str, str, str, str]:
        """Identifies the declaration: its slot and the code behind it."""
        if self.kind == "strategy":
            ident = ",".join(impl.name for impl in self.payload)
        elif self.kind == "op_attr":
            ident = f"{getattr(self.payload, '__module__', '')}.{getattr(self.payload, '__qualname__', '')}"
        else:
            ident = ""
        return (self.kind, self.name, self.attr, ident)


@dataclasses.dataclass(frozen=True)
class HookInfo:
    """What :func:`registered` reports for one installed hook."""

    kind: str
    name: str
    attr: str
    level: int
    targets: Optional[Tuple[str, ...]]
    description: str

    def __str__(self) -> str:
        targets = ",".join(self.targets) if self.targets else "any"
        what = f"{self.name}.{self.attr}" if self.attr else self.name
        return f"{self.kind:<16} {what:<40} level={self.level:<3} targets={targets}  {self.description}"


# --------------------------------------------------------------------------
# Declaration helpers used by feature modules.
# --------------------------------------------------------------------------
def relay_op(
    name: str,
    inputs: Sequence[str],
    type_relation: Callable,
    attrs_type_key: str,
    pattern: int,
    description: str = "",
) -> Hook:
    """Declare a new Relay op: its ``inputs``' names, ``type_relation`` (``(arg_types, attrs) -> Type``,
    None while unknown), the attributes' type key and ``TOpPattern``. Its kernels come from a
    :func:`strategy` hook for the same name.

    TVM cannot remove an op: :func:`unregister` takes its pattern and strategy away (nothing builds it),
    and a later :func:`register` finds it and installs them again.

    Examples
    --------
    >>> hook = relay_op("tcutils.example", ("x",), lambda types, attrs: types[0], "DictAttrs", 8)
    >>> hook.kind, hook.attr
    ('relay_op', 'TOpPattern')
    """
    payload = dict(inputs=tuple(inputs), type_relation=type_relation, attrs_type_key=attrs_type_key,
                   pattern=int(pattern))
    return Hook("relay_op", name, "TOpPattern", LEVEL, None, payload, description)


def op_attr(
    op_name: str,
    attr: str,
    handler: Callable,
    targets: Optional[Sequence[str]] = None,
    level: int = LEVEL,
    description: str = "",
) -> Hook:
    """Declare a delegating op-attribute hook.

    For the layout-style attributes (``FTVMAlterOpLayout``, ``FTVMLegalize``,
    ``FTVMConvertOpLayout``, ``FTVMQnnLegalize``, ``FTVMQnnCanonicalize``) ``handler``
    has TVM's signature for that attribute and returns ``None`` for every case it leaves to the attribute it replaces.
    For any other attribute (for example ``target.<compiler>`` predicates) the
    handler is installed as is.

    Examples
    --------
    >>> def legalize_dense(attrs, inputs, types):
    ...     return None  # leave everything to TVM
    >>> hook = op_attr("nn.dense", "FTVMLegalize", legalize_dense, targets=["cpu"])
    >>> hook.level > 10, hook.targets  # above TVM's own level 10, only for CPU targets
    (True, ('cpu',))
    """
    return Hook(
        "op_attr", op_name, attr, level, _keys(targets), handler, description or _doc(handler)
    )


def strategy(
    op_name: str,
    impls: Sequence[StrategyImpl],
    targets: Optional[Sequence[str]] = None,
    level: int = LEVEL,
    description: str = "",
) -> Hook:
    """Declare a strategy table for ``op_name``.

    The installed ``FTVMStrategy`` calls TVM's own strategy first and then adds
    every row of ``impls`` that applies (rows marked ``exclusive`` replace
    TVM's implementations). When TVM's strategy raises and a row applies, the
    strategy is made of the applicable rows alone.

    Examples
    --------
    >>> hook = strategy("nn.conv2d", [], targets=["cuda", "gpu"])
    >>> hook.kind, hook.attr
    ('strategy', 'FTVMStrategy')
    """
    return Hook(
        "strategy", op_name, "FTVMStrategy", level, _keys(targets), tuple(impls),
        # A name once: rows of one implementation that differ only in when they apply (operand types) are one.
        description or ", ".join(dict.fromkeys(impl.name for impl in impls)),
    )


def autotvm_template(
    task_name: str, compute: Callable, schedule: Callable, description: str = ""
) -> Hook:
    """Declare an AutoTVM TOPI template (compute and schedule).

    ``compute(cfg, *args, **kwargs)`` and ``schedule(cfg, outs)`` are plain
    functions; :func:`template` returns the AutoTVM-wrapped pair after
    :func:`register` ran.

    Examples
    --------
    >>> hook = autotvm_template("tcutils.example", lambda cfg, *a: None, lambda cfg, outs: None)
    >>> hook.kind, hook.name
    ('autotvm_template', 'tcutils.example')
    """
    return Hook("autotvm_template", task_name, "", 0, None, (compute, schedule), description)


def packed_func(name: str, func: Callable, description: str = "") -> Hook:
    """Declare a global packed function.

    Examples
    --------
    >>> hook = packed_func("tvm_tcutils.echo", lambda x: x)
    >>> hook.kind, hook.payload(3)
    ('packed_func', 3)
    """
    return Hook("packed_func", name, "", 0, None, func, description or _doc(func))


def pattern_table(compiler: str, table: Callable[[], list], description: str = "") -> Hook:
    """Declare a BYOC pattern table for ``compiler``.

    Examples
    --------
    >>> hook = pattern_table("tcutils_example", lambda: [])
    >>> hook.kind, hook.name
    ('pattern_table', 'tcutils_example')
    """
    return Hook("pattern_table", compiler, "", 0, None, table, description)


# --------------------------------------------------------------------------
# The registry itself.
# --------------------------------------------------------------------------
def _keys(targets: Optional[Iterable[str]]) -> Optional[Tuple[str, ...]]:
    return None if targets is None else tuple(str(t) for t in targets)


def _doc(func: Any) -> str:
    doc = (getattr(func, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else getattr(func, "__name__", "")


def _state() -> Dict[str, Any]:
    """State that must survive ``importlib.reload`` of this package.

    It lives on the ``tvm`` module because TVM's registries outlive ours.
    """
    state = getattr(tvm, "_tvm_tcutils_state", None)
    if state is None:
        state = {"originals": {}, "installed": {}, "templates": {}}
        setattr(tvm, "_tvm_tcutils_state", state)
    return state


def target_matches(keys: Optional[Tuple[str, ...]], target: Optional[tvm.target.Target]) -> bool:
    """Whether ``target`` has one of ``keys`` (``None`` keys match any target)."""
    if keys is None:
        return True
    if target is None:
        return False
    return any(key in keys for key in list(target.keys) + [target.kind.name])


def _make_layout_wrapper(hooks: Sequence[Hook], original: Optional[Callable]) -> Callable:
    """One attribute value for all hooks of a layout-style slot, in declaration order."""

    def _wrapper(*args):
        target = tvm.target.Target.current(allow_none=True)
        for hook in hooks:
            if target_matches(hook.targets, target):
                result = hook.payload(*args)
                if result is not None:
                    return result
        if original is not None:
            return original(*args)
        return None

    _wrapper.__name__ = f"tcutils_{hooks[0].attr}_{hooks[0].name.replace('.', '_')}"
    return _wrapper


def _make_strategy(hooks: Sequence[Hook], original: Optional[Callable]) -> Callable:
    """One ``FTVMStrategy`` for all strategy tables declared for an op."""
    op_name = hooks[0].name

    def _applicable(attrs, inputs, out_type, target) -> List[StrategyImpl]:
        chosen = []
        for hook in hooks:
            if not target_matches(hook.targets, target):
                continue
            for impl in hook.payload:
                try:
                    if impl.applies(attrs, inputs, out_type, target):
                        chosen.append(impl)
                # A boundary on purpose: this runs inside every relay.build of the op, and a bug in one
                # of our predicates must not take TVM's own path down with it. Logged with its type, the
                # implementation left out.
                except Exception as err:  # noqa: BLE001
                    logger.warning("predicate of %s failed (%s: %s); not applied", impl.name, type(err).__name__, err)
        return chosen

    def _strategy_fn(attrs, inputs, out_type, target):
        chosen = _applicable(attrs, inputs, out_type, target)
        base = None
        if original is not None:
            try:
                base = original(attrs, inputs, out_type, target)
            # TVM's strategies decline a case they do not support (a layout, a dtype) with these;
            # ours may still cover it, otherwise the user sees TVM's error unchanged.
            except (RuntimeError, ValueError, AssertionError) as err:
                if not chosen:
                    raise
                logger.debug("TVM's strategy for %s declined (%s: %s); using tvm-tcutils's",
                             op_name, type(err).__name__, err)
        elif not chosen:
            raise RuntimeError(f"no strategy for {op_name} on target {target}")
        if base is None or any(impl.exclusive for impl in chosen):
            base = relay.op.OpStrategy()
        for impl in chosen:
            base.add_implementation(impl.fcompute, impl.fschedule, name=impl.name, plevel=impl.plevel)
        return base

    generic = tvm.target.get_native_generic_func(f"tvm_tcutils.{op_name}.FTVMStrategy")
    generic.set_default(_strategy_fn, allow_override=True)
    return generic


class Registry:
    """A set of hook declarations and their installation into TVM.

    The package keeps one instance (see :func:`register`); tests may create
    their own to exercise the mechanism on a throw-away set of hooks.
    """

    def __init__(self, providers: Sequence[str] = ()):
        self._providers = tuple(providers)
        self._extra: List[Hook] = []
        self._lock = threading.RLock()

    # -- declarations -----------------------------------------------------
    def add(self, *hooks: Hook) -> None:
        """Add hook declarations (not yet applied)."""
        self._extra.extend(hooks)

    def declared(self) -> List[Hook]:
        """All declared hooks, providers first, in declaration order."""
        hooks: List[Hook] = []
        for name in self._providers:
            hooks.extend(importlib.import_module(name).hooks())
        hooks.extend(self._extra)
        seen, single = set(), set()
        for hook in hooks:
            if hook.key in seen:
                raise ValueError(f"hook declared twice: {hook.key}")
            seen.add(hook.key)
            if hook.kind in _SINGLE_SLOT_KINDS:
                if hook.slot in single:
                    raise ValueError(f"hook declared twice: {hook.slot}")
                single.add(hook.slot)
        return hooks

    # -- application ------------------------------------------------------
    def register(self) -> List[HookInfo]:
        """Install every declared hook; safe to call any number of times."""
        with self._lock:
            hooks = self.declared()
            # Templates first: strategies look them up when they run.
            order = {"relay_op": -1, "autotvm_template": 0, "packed_func": 1, "pattern_table": 2, "op_attr": 3,
                     "strategy": 4}
            for slot_hooks in _by_slot(sorted(hooks, key=lambda h: order[h.kind])):
                getattr(self, f"_install_{slot_hooks[0].kind}")(slot_hooks)
                for hook in slot_hooks:
                    _state()["installed"][hook.key] = hook
            return self.registered()

    def registered(self) -> List[HookInfo]:
        """What is installed now, as :class:`HookInfo` rows."""
        return [
            HookInfo(h.kind, h.name, h.attr, h.level, h.targets, h.description)
            for h in _state()["installed"].values()
        ]

    def unregister(self) -> None:
        """Restore what TVM had before any hook of this registry was installed."""
        with self._lock:
            state = _state()
            mine = [hook for hook in self.declared() if hook.key in state["installed"]]
            for slot_hooks in _by_slot(mine):
                getattr(self, f"_uninstall_{slot_hooks[0].kind}")(slot_hooks[0])
                for hook in slot_hooks:
                    del state["installed"][hook.key]

    # -- per kind (each receives all hooks of one slot) ---------------------
    @staticmethod
    def _original(op: tvm.ir.Op, attr: str) -> Optional[Callable]:
        originals = _state()["originals"]
        key = (op.name, attr)
        if key not in originals:
            originals[key] = op.get_attr(attr)
        return originals[key]

    def _install_op_attr(self, hooks: List[Hook]) -> None:
        first = hooks[0]
        op = tvm.ir.Op.get(first.name)
        original = self._original(op, first.attr)
        if first.attr in _LAYOUT_ATTRS:
            value = _make_layout_wrapper(hooks, original)
        elif len(hooks) == 1:
            value = first.payload
        else:
            raise ValueError(f"{first.name}.{first.attr} can hold one hook only; declared {len(hooks)}")
        op.reset_attr(first.attr)
        op.set_attr(first.attr, value, max(hook.level for hook in hooks))

    def _install_strategy(self, hooks: List[Hook]) -> None:
        first = hooks[0]
        op = tvm.ir.Op.get(first.name)
        original = self._original(op, first.attr)
        op.reset_attr(first.attr)
        op.set_attr(first.attr, _make_strategy(hooks, original), max(hook.level for hook in hooks))

    def _uninstall_op_attr(self, hook: Hook) -> None:
        op = tvm.ir.Op.get(hook.name)
        original = _state()["originals"].pop((hook.name, hook.attr), None)
        op.reset_attr(hook.attr)
        if original is not None:
            # TVM's own attributes live at level 10; restoring there keeps a
            # later TVM registration at a higher level working as before.
            op.set_attr(hook.attr, original, 10)

    _uninstall_strategy = _uninstall_op_attr

    def _install_relay_op(self, hooks: List[Hook]) -> None:
        (hook,) = hooks  # op names are unique (checked by declared())
        declaration = hook.payload
        ops = _state().setdefault("relay_ops", set())
        if hook.name in tvm.ir.Op.list_op_names():
            if hook.name not in ops:
                raise ValueError(f"Relay op {hook.name!r} is already registered by someone else")
        else:
            relay.op.op.register(hook.name, hook.description)
            op = tvm.ir.Op.get(hook.name)
            op.set_num_inputs(len(declaration["inputs"]))
            for name in declaration["inputs"]:
                op.add_argument(name, "Tensor", name)
            op.set_attrs_type_key(declaration["attrs_type_key"])
            # The relation is looked up through this module's function each time, so that a reload's
            # new definition is the one used (TVM keeps the first relation an op was given).
            op.add_type_rel(f"{hook.name}Rel", _relation_of(hook.name))
            op.set_support_level(10)
            ops.add(hook.name)
        _state().setdefault("relay_op_relations", {})[hook.name] = declaration["type_relation"]
        op = tvm.ir.Op.get(hook.name)
        op.reset_attr(hook.attr)
        op.set_attr(hook.attr, declaration["pattern"], hook.level)

    def _uninstall_relay_op(self, hook: Hook) -> None:
        tvm.ir.Op.get(hook.name).reset_attr(hook.attr)
        _state().setdefault("relay_op_relations", {}).pop(hook.name, None)

    def _install_autotvm_template(self, hooks: List[Hook]) -> None:
        (hook,) = hooks  # task names are unique (checked by declared())
        compute, schedule = hook.payload
        table = autotvm.task.task.TASK_TABLE
        templates = _state()["templates"]
        if hook.name in table and hook.name not in templates:
            raise ValueError(f"AutoTVM task {hook.name!r} is already registered by someone else")
        table.pop(hook.name, None)
        wrapped_compute = autotvm.register_topi_compute(hook.name)(compute)
        wrapped_schedule = autotvm.register_topi_schedule(hook.name)(schedule)
        templates[hook.name] = (wrapped_compute, wrapped_schedule)

    def _uninstall_autotvm_template(self, hook: Hook) -> None:
        autotvm.task.task.TASK_TABLE.pop(hook.name, None)
        _state()["templates"].pop(hook.name, None)

    def _install_packed_func(self, hooks: List[Hook]) -> None:
        (hook,) = hooks
        # What TVM had under the name (e.g. its nvcc tvm_callback_cuda_compile) comes back on unregister;
        # remembered once, so that a second register() does not remember our own function.
        previous = _state().setdefault("packed_previous", {})
        if hook.name not in previous:
            previous[hook.name] = tvm.get_global_func(hook.name, allow_missing=True)
        tvm.register_func(hook.name, hook.payload, override=True)

    def _uninstall_packed_func(self, hook: Hook) -> None:
        original = _state().setdefault("packed_previous", {}).pop(hook.name, None)
        if original is None:
            tvm._ffi.registry.remove_global_func(hook.name)
        else:
            tvm.register_func(hook.name, original, override=True)

    def _install_pattern_table(self, hooks: List[Hook]) -> None:
        (hook,) = hooks
        relay.op.contrib.register_pattern_table(hook.name, hook.payload)

    def _uninstall_pattern_table(self, hook: Hook) -> None:
        from tvm.relay.op.contrib import register as _contrib_register

        _contrib_register._PATTERN_TABLES.pop(hook.name, None)


def _relation_of(name: str) -> Callable:
    def relation(arg_types, attrs):
        current = _state().get("relay_op_relations", {}).get(name)
        if current is None:
            raise ValueError(f"Relay op {name!r} is not registered now: import tvm_tcutils (or call register())")
        return current(arg_types, attrs)

    return relation


def _by_slot(hooks: Sequence[Hook]) -> List[List[Hook]]:
    """Group hooks by the registry entry they write, keeping declaration order."""
    groups: Dict[Tuple[str, str, str], List[Hook]] = {}
    for hook in hooks:
        groups.setdefault(hook.slot, []).append(hook)
    return list(groups.values())


_REGISTRY = Registry(HOOK_PROVIDERS)


def register() -> List[HookInfo]:
    """Install all of the package's hooks into TVM (idempotent).

    ``import tvm_tcutils`` calls this once; calling it again re-installs the
    current definitions (for example after ``importlib.reload``) without error.

    Returns
    -------
    list of HookInfo
        What is installed.

    Examples
    --------
    >>> import tvm_tcutils
    >>> rows = tvm_tcutils.register()
    >>> rows == tvm_tcutils.registered()
    True
    """
    return _REGISTRY.register()


def registered() -> List[HookInfo]:
    """List the hooks installed by :func:`register` (kind, op, attribute, level, targets).

    Examples
    --------
    >>> import tvm_tcutils
    >>> rows = tvm_tcutils.registered()
    >>> sorted({row.kind for row in rows})
    ['autotvm_template', 'op_attr', 'packed_func', 'pattern_table', 'relay_op', 'strategy']
    >>> dense = [row for row in rows if row.kind == "strategy" and row.name == "nn.dense"]
    >>> print(dense[0])  # doctest: +NORMALIZE_WHITESPACE
    strategy nn.dense.FTVMStrategy level=20 targets=cuda,gpu tcutils.dense_tensorcore.cuda, tcutils.dense_mma.cuda,
    tcutils.dense_wgmma.cuda
    """
    return _REGISTRY.registered()


def unregister() -> None:
    """Remove the package's hooks and restore TVM's originals.

    Examples
    --------
    >>> import tvm_tcutils
    >>> # One statement, so that the hooks are back whatever the checks below say.
    >>> tvm_tcutils.unregister(); left = tvm_tcutils.registered(); back = tvm_tcutils.register()
    >>> [row for row in left if row.name in ("nn.conv2d", "nn.dense")]  # the package's own are gone
    []
    >>> {"nn.conv2d", "nn.dense"} <= {row.name for row in back}
    True
    """
    _REGISTRY.unregister()


def replaced_func(name: str) -> Optional[Callable]:
    """The packed function a ``packed_func`` hook replaced (``None`` if the name was free).

    Examples
    --------
    >>> replaced_func("tvm_tcutils.no_such_function") is None
    True
    """
    return _state().get("packed_previous", {}).get(name)


@contextlib.contextmanager
def overriding_func(name: str, func: Callable) -> Iterator[None]:
    """Register ``func`` as global packed function ``name`` for a scope; what was there comes back.

    For benchmarks that compare variants of a packed function the package
    registered (compiled code looks it up at its first call).

    Examples
    --------
    >>> import tvm
    >>> with overriding_func("tvm_tcutils.example_echo", lambda x: x + 1):
    ...     tvm.get_global_func("tvm_tcutils.example_echo")(1)
    2
    >>> tvm.get_global_func("tvm_tcutils.example_echo", allow_missing=True) is None
    True
    """
    previous = tvm.get_global_func(name, allow_missing=True)
    tvm.register_func(name, func, override=True)
    try:
        yield
    finally:
        if previous is None:
            tvm._ffi.registry.remove_global_func(name)
        else:
            tvm.register_func(name, previous, override=True)


def override_for_process(name: str, func: Callable) -> None:
    """Register ``func`` as global packed function ``name`` for the rest of this process: only for
    processes of the package's own (the local tuning runner's server), never a user's.

    Examples
    --------
    >>> import subprocess, sys
    >>> code = ("from tvm_tcutils import registry; import tvm; "
    ...         "registry.override_for_process('tvm_tcutils.example_one', lambda: 1); "
    ...         "print(tvm.get_global_func('tvm_tcutils.example_one')())")
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    '1'
    """
    tvm.register_func(name, func, override=True)


def template(task_name: str) -> Tuple[Callable, Callable]:
    """The AutoTVM-wrapped ``(compute, schedule)`` of a registered template.

    Examples
    --------
    >>> compute, schedule = template("tcutils.conv2d_hwnc_tensorcore.cuda")
    >>> compute.__name__, schedule.__name__
    ('conv2d_hwnc_template', 'schedule_conv2d_hwnc')
    """
    try:
        return _state()["templates"][task_name]
    except KeyError:
        known = sorted(_state()["templates"])
        raise KeyError(f"no AutoTVM template {task_name!r} registered; known: {known}") from None
