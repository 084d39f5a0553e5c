"""The dot-product unit's instructions in flight: measured once per machine, cached, stated for other CPUs."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import tvm
import tvm.topi.testing
from tvm import relay

import tvm_tcutils
from tvm_tcutils.dotprod import cpu_facts
from tvm_tcutils.dotprod.isa import X86_VNNI, for_target

from conftest import host_dot_target


@pytest.fixture
def facts_cache(tmp_path, monkeypatch):
    """An empty package cache, no stated fact, no fact remembered by this process; the measurement
    replaced by a counter returning 7.5 (``calls`` lists the ISAs measured)."""
    monkeypatch.setenv("TVM_TCUTILS_CACHE", str(tmp_path))
    monkeypatch.delenv(cpu_facts.CHAINS_ENV, raising=False)
    monkeypatch.setattr(cpu_facts, "_MEASURED", {})
    calls = []

    def fake(isa, rounds=3):
        calls.append(isa.name)
        return 7.5

    monkeypatch.setattr(cpu_facts, "measure_chains_in_flight", fake)
    return tmp_path / "cpu" / "dot_chains.json", calls


def _host_isa():
    target = host_dot_target()
    return for_target(target), tvm.target.Target(target)


def test_the_host_is_measured_once_then_read_from_the_cache(facts_cache):
    path, calls = facts_cache
    isa, host = _host_isa()
    assert cpu_facts.chains_in_flight(isa, host) == 7.5
    assert cpu_facts.chains_in_flight(isa, host) == 7.5
    assert calls == [isa.name]
    record, = json.loads(path.read_text()).values()
    assert record == {"chains": 7.5}
    cpu_facts._MEASURED.clear()  # a new process reads the file
    assert cpu_facts.chains_in_flight(isa, host) == 7.5 and calls == [isa.name]


@pytest.mark.parametrize("damage", ["{cut", "[1, 2]", '{"KEY": {"chains": "many"}}'])
def test_a_damaged_cache_is_named_and_measured_again(facts_cache, caplog, damage):
    path, calls = facts_cache
    isa, host = _host_isa()
    path.parent.mkdir(parents=True)
    path.write_text(damage.replace("KEY", cpu_facts._machine_key(isa)))
    with caplog.at_level(logging.WARNING, logger=cpu_facts.__name__):
        assert cpu_facts.chains_in_flight(isa, host) == 7.5
    assert str(path) in caplog.text and "damaged" in caplog.text
    assert calls == [isa.name]
    assert json.loads(path.read_text())[cpu_facts._machine_key(isa)] == {"chains": 7.5}


def test_an_unwritable_cache_warns_and_keeps_the_fact_for_the_process(facts_cache, caplog, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TVM_TCUTILS_CACHE", str(blocker))  # a file where the folder should be
    _, calls = facts_cache
    isa, host = _host_isa()
    with caplog.at_level(logging.WARNING, logger=cpu_facts.__name__):
        assert cpu_facts.chains_in_flight(isa, host) == 7.5
    assert "not written" in caplog.text


def test_a_cpu_that_does_not_run_here_is_not_measured(facts_cache):
    path, calls = facts_cache
    isa, host = _host_isa()
    other = "icelake-server" if "icelake-server" not in str(host) else "znver4"
    assert cpu_facts.chains_in_flight(X86_VNNI, tvm.target.Target(f"llvm -mcpu={other}")) is None
    assert cpu_facts.chains_in_flight(isa, None) is None  # no current target
    assert calls == [] and not path.exists()


def test_a_stated_fact_wins_and_a_bad_one_names_the_variable(facts_cache, monkeypatch):
    _, calls = facts_cache
    isa, host = _host_isa()
    monkeypatch.setenv(cpu_facts.CHAINS_ENV, "12")
    assert cpu_facts.chains_in_flight(isa, host) == 12.0
    monkeypatch.setenv(cpu_facts.CHAINS_ENV, "0")
    assert cpu_facts.chains_in_flight(isa, host) is None
    for bad in ("many", "-3"):
        monkeypatch.setenv(cpu_facts.CHAINS_ENV, bad)
        with pytest.raises(ValueError, match=cpu_facts.CHAINS_ENV):
            cpu_facts.chains_in_flight(isa, host)
    assert calls == []


def test_the_real_measurement_is_a_count_of_instructions_in_flight():
    isa, _ = _host_isa()
    if not isa.accumulating:  # an AVX2 / SSE host: its loop would be hoisted (it read 0.4 on a Zen 3)
        with pytest.raises(ValueError, match=f"isa: {isa.name}.*measurable: x86_vnni"):
            cpu_facts.measure_chains_in_flight(isa, rounds=1)
        return
    chains = cpu_facts.measure_chains_in_flight(isa, rounds=1)
    assert 1.0 <= chains <= cpu_facts.PEAK_CHAINS, chains


def test_a_model_measured_while_it_compiles_under_the_users_context(tmp_path, monkeypatch):
    # The first int8 conv of a process on this CPU measures the fact in the middle of relay.build's
    # lowering: under the user's PassContext (an instrument that sees every pass), with no thread count
    # set. The model builds and matches numpy; the fact is cached; TVM_NUM_THREADS stays unset.
    target = host_dot_target()
    monkeypatch.setenv("TVM_TCUTILS_CACHE", str(tmp_path))
    monkeypatch.delenv(cpu_facts.CHAINS_ENV, raising=False)
    monkeypatch.setattr(cpu_facts, "_MEASURED", {})
    threads = os.environ.pop("TVM_NUM_THREADS", None)
    try:
        data = relay.var("data", shape=(1, 32, 14, 14), dtype="uint8")
        weight = relay.var("weight", shape=(32, 32, 3, 3), dtype="int8")
        out = relay.nn.conv2d(data, weight, padding=1, kernel_size=3, channels=32, out_dtype="int32")
        mod = tvm.IRModule.from_expr(relay.Function([data, weight], out))
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (1, 32, 14, 14)).astype("uint8")
        w = rng.integers(-128, 128, (32, 32, 3, 3)).astype("int8")
        seen = []

        @tvm.instrument.pass_instrument
        class Names:
            def run_before_pass(self, mod, info):
                seen.append(info.name)

        with tvm.transform.PassContext(opt_level=3, instruments=[Names()]):
            lib = relay.build(mod, target=target, params={"weight": w})
        assert "TVM_NUM_THREADS" not in os.environ
    finally:
        if threads is not None:
            os.environ["TVM_NUM_THREADS"] = threads
    module = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    module.set_input("data", x)
    module.run()
    expected = tvm.topi.testing.conv2d_nchw_python(x.astype("int32"), w.astype("int32"), 1, 1)
    np.testing.assert_array_equal(module.get_output(0).numpy(), expected)
    isa = for_target(target)
    if isa.conv_tile_pixels:  # only the ISAs with a pixel block ask for the fact
        cached = json.loads((tmp_path / "cpu" / "dot_chains.json").read_text())
        assert list(cached) == [cpu_facts._machine_key(isa)]
    assert seen and tvm_tcutils.host_target()
