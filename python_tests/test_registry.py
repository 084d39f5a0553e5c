"""The one registry: delegation, levels, idempotence, listing and restoring."""

import numpy as np
import pytest
import tvm
from tvm import relay, te, topi

import tvm_tcutils
from tvm_tcutils import registry
from conftest import run_python

OP = "nn.leaky_relu"  # an op no feature of the package hooks


def _leaky_mod():
    x = relay.var("x", shape=(4, 8))
    return tvm.IRModule.from_expr(relay.Function([x], relay.nn.leaky_relu(x, alpha=0.5)))


@pytest.fixture
def reg():
    r = registry.Registry()
    yield r
    r.unregister()
    # A throw-away registry that hooked a slot the package also hooks (nn.conv2d's FTVMLegalize)
    # put TVM's original back there on unregister: reinstall the package's hooks for later tests.
    tvm_tcutils.register()


def test_op_attr_hook_delegates_and_filters_targets(reg):
    seen = []

    def legalize(attrs, inputs, types):
        seen.append(float(attrs.alpha))
        return relay.nn.relu(inputs[0])  # deliberately different, to see it applied

    reg.add(registry.op_attr(OP, "FTVMLegalize", legalize, targets=["cpu"]))
    reg.register()
    with tvm.target.Target("llvm"):
        legal = relay.transform.Legalize()(relay.transform.InferType()(_leaky_mod()))
    assert "nn.relu" in legal.astext() and "leaky" not in legal.astext()
    assert seen == [0.5]
    # Another target key: the hook stays out of the way.
    with tvm.target.Target("cuda -arch=sm_80"):
        legal = relay.transform.Legalize()(relay.transform.InferType()(_leaky_mod()))
    assert "nn.leaky_relu" in legal.astext()


def test_handler_returning_none_delegates_to_original(reg):
    calls = []
    tvm_own = tvm.ir.Op.get("nn.conv2d").get_attr("FTVMLegalize")
    assert tvm_own is not None

    def never(attrs, inputs, types):
        calls.append(1)
        return None

    reg.add(registry.op_attr("nn.conv2d", "FTVMLegalize", never, targets=["cpu"]))
    reg.register()
    x = relay.var("x", shape=(1, 3, 8, 8), dtype="int8")
    w = relay.var("w", shape=(4, 3, 3, 3), dtype="int8")
    mod = tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.conv2d(x, w, out_dtype="int32")))
    mod = relay.transform.InferType()(mod)
    with tvm.target.Target("llvm"):
        ours = relay.transform.Legalize()(mod)
    reg.unregister()
    with tvm.target.Target("llvm"):
        theirs = relay.transform.Legalize()(mod)
    assert calls
    assert tvm.ir.structural_equal(ours, theirs)


def test_strategy_rows_are_added_and_exclusive_rows_replace(reg):
    def compute(attrs, inputs, out_type):
        return [topi.nn.relu(inputs[0])]

    row = registry.StrategyImpl(
        "tcutils_test.relu_leaky", compute, relay.op.strategy.wrap_topi_schedule(topi.generic.schedule_injective),
        applies=lambda attrs, inputs, out_type, target: float(attrs.alpha) == 0.5, plevel=50, exclusive=True,
    )
    reg.add(registry.strategy(OP, [row], targets=["cpu"]))
    reg.register()
    mod = relay.transform.InferType()(_leaky_mod())
    call = mod["main"].body
    with tvm.target.Target("llvm"):
        impl, _ = relay.backend.te_compiler.select_implementation(
            call.op, call.attrs, [te.placeholder((4, 8))], call.checked_type, tvm.target.Target("llvm")
        )
    assert impl.name == "tcutils_test.relu_leaky"
    lib = relay.build(mod, target="llvm")
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    data = np.linspace(-1, 1, 32, dtype="float32").reshape(4, 8)
    runner.set_input("x", data)
    runner.run()
    np.testing.assert_allclose(runner.get_output(0).numpy(), np.maximum(data, 0))


def test_register_is_idempotent_and_lists_hooks(reg):
    reg.add(registry.op_attr(OP, "FTVMLegalize", lambda *a: None, targets=["cpu"], description="noop"))
    first = reg.register()
    second = reg.register()
    assert first == second
    rows = [r for r in second if r.name == OP]
    assert rows and rows[0].level == registry.LEVEL and rows[0].targets == ("cpu",)
    assert "noop" in str(rows[0])


def test_unregister_restores_original(reg):
    before = tvm.ir.Op.get(OP).get_attr("FTVMStrategy")
    reg.add(registry.strategy(OP, [], targets=["cpu"]))
    reg.register()
    assert tvm.ir.Op.get(OP).get_attr("FTVMStrategy").same_as(before) is False
    reg.unregister()
    assert tvm.ir.Op.get(OP).get_attr("FTVMStrategy").same_as(before)


def test_duplicate_declaration_is_an_error(reg):
    hook = registry.packed_func("tvm_tcutils.test_echo", lambda x: x)
    other = registry.packed_func("tvm_tcutils.test_echo", lambda x: x + 1)
    for pair in ((hook, hook), (hook, other)):
        reg.add(*pair)
        with pytest.raises(ValueError, match="declared twice"):
            reg.register()
        reg._extra.clear()


def test_hooks_of_one_slot_chain_by_target(reg):
    def to_relu(attrs, inputs, types):
        return relay.nn.relu(inputs[0])

    def to_sigmoid(attrs, inputs, types):
        return relay.sigmoid(inputs[0])

    reg.add(
        registry.op_attr(OP, "FTVMLegalize", to_relu, targets=["cpu"]),
        registry.op_attr(OP, "FTVMLegalize", to_sigmoid, targets=["cuda"]),
    )
    reg.register()
    assert len([r for r in reg.registered() if r.name == OP]) == 2
    texts = {}
    for target in ("llvm", "cuda -arch=sm_80", "opencl"):
        with tvm.target.Target(target):
            texts[target] = relay.transform.Legalize()(relay.transform.InferType()(_leaky_mod())).astext()
    assert "nn.relu" in texts["llvm"] and "sigmoid" not in texts["llvm"]
    assert "sigmoid" in texts["cuda -arch=sm_80"]
    assert "nn.leaky_relu" in texts["opencl"]


def test_strategy_tables_of_one_op_merge(reg):
    def compute(attrs, inputs, out_type):
        return [topi.nn.relu(inputs[0])]

    schedule = relay.op.strategy.wrap_topi_schedule(topi.generic.schedule_injective)
    always = lambda *args: True  # noqa: E731
    reg.add(
        registry.strategy(OP, [registry.StrategyImpl("tcutils_test.a", compute, schedule, always, plevel=40)],
                          targets=["cpu"]),
        registry.strategy(OP, [registry.StrategyImpl("tcutils_test.b", compute, schedule, always, plevel=60)],
                          targets=["cpu"]),
    )
    reg.register()
    call = relay.transform.InferType()(_leaky_mod())["main"].body
    target = tvm.target.Target("llvm")
    with target:
        impl, _ = relay.backend.te_compiler.select_implementation(
            call.op, call.attrs, [te.placeholder((4, 8))], call.checked_type, target
        )
    assert impl.name == "tcutils_test.b"


def test_packed_func_and_template_and_pattern_table(reg):
    def compute(cfg, data):
        cfg.define_knob("unroll", [0, 1])
        return topi.nn.relu(data)

    def schedule(cfg, outs):
        return te.create_schedule([o.op for o in outs])

    reg.add(
        registry.packed_func("tvm_tcutils.test_echo", lambda x: x * 2),
        registry.autotvm_template("tcutils.test_relu", compute, schedule),
        registry.pattern_table("tcutils_test", lambda: []),
    )
    reg.register()
    reg.register()  # re-registering a template must not raise "already registered"
    assert tvm.get_global_func("tvm_tcutils.test_echo")(21) == 42
    assert "tcutils.test_relu" in tvm.autotvm.task.task.TASK_TABLE
    assert relay.op.contrib.get_pattern_table("tcutils_test") == []
    wrapped_compute, _ = registry.template("tcutils.test_relu")
    assert callable(wrapped_compute)
    with pytest.raises(KeyError, match="known"):
        registry.template("tcutils.nope")
    reg.unregister()
    assert tvm.get_global_func("tvm_tcutils.test_echo", allow_missing=True) is None
    assert "tcutils.test_relu" not in tvm.autotvm.task.task.TASK_TABLE


def test_package_register_twice_and_reload():
    result = run_python(
        "import importlib, tvm_tcutils\n"
        "a = tvm_tcutils.registered()\n"
        "tvm_tcutils.register(); tvm_tcutils.register()\n"
        "importlib.reload(tvm_tcutils.registry); importlib.reload(tvm_tcutils)\n"
        "b = tvm_tcutils.registered()\n"
        "assert [(r.kind, r.name, r.attr) for r in a] == [(r.kind, r.name, r.attr) for r in b]\n"
        "print('ok', len(b))\n",
        fresh=False,  # forked from the fork server: the package imported (and registered) once, as here
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_every_installed_hook_is_above_tvm_level():
    for row in tvm_tcutils.registered():
        if row.kind in ("op_attr", "strategy"):
            assert row.level > 10, row
