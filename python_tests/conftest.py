"""Shared fixtures: offline settings, small models, the subprocess runner."""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import subprocess
import sys
from typing import Callable, Sequence

import numpy as np
import pytest

# TVM pins the calling thread when it sets up its thread pool: with one pool thread (TVM_NUM_THREADS=1,
# which the parallel workers get below, or x86's default of half the CPUs on a 2-CPU machine) the main
# thread goes to CPU 0 for good, and every process it starts afterwards (the fork server's children,
# tuning and Collage worker pools, RPC servers) inherits that one-CPU mask. Both xdist workers and most
# subprocesses then shared CPU 0 while the other CPU idled (the suite: 844 s, 41-45 % idle; unpinned:
# 481 s). Nothing the tests check depends on TVM's own pinning; the bench code that pins does it
# itself (os.sched_setaffinity). Set before TVM's pool can exist; inherited by every child process.
os.environ.setdefault("TVM_BIND_THREADS", "0")

import tvm_tcutils  # noqa: E402  (after the offline setting)
import tvm  # noqa: E402
from tvm import relay  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from _tvm_speedups import cache_libinfo  # noqa: E402

cache_libinfo()


def pytest_report_header(config) -> list[str]:
    """Name the interpreter and TVM in the session header, so a CI log says what it ran on."""
    return [
        f"python: {sys.version.split()[0]} ({sys.executable})",
        f"tvm: {tvm.__version__} ({os.path.dirname(tvm.__file__)})",
    ]


#: Markers that are off by default: each runs only when selected with ``-m NAME``.
OPT_IN_MARKERS = {
    "benchmark": "benchmark: run with -m benchmark",
    "slow": "slow (minutes): run with -m slow",
}

#: Tests that also run with ``-m slow`` only: the heaviest variants of checks whose lighter siblings stay in the
#: default run (node ids, a parametrized one's brackets included, or a test's whole name). The default run
#: must stay under the CI's 10 minutes on the slowest machine the project meets: on a 2-vCPU Ice Lake VM
#: (session 61) the suite took 742 s against 434 s on Zen 4; these are about 580 s of its 1,440 worker-seconds.
#: Each entry names the sibling that still covers its point.
SLOW_IN_DEFAULT_RUN = {
    # CUDA code for every verified arch (no GPU needed): each arch's products stay in test_sass / test_epilogue.
    "python_tests/tensorcore/test_encoder_cuda.py::test_verified_archs_put_every_integer_product_on_tensor_cores":
        "test_sass's per-template integer mma",
    "python_tests/tensorcore/test_mma_gemm.py::test_gpu_check_rehearses_the_kernel_beside_the_wmma_one":
        "test_relay_build_takes_the_kernel_on_verified_archs_only",
    "python_tests/tensorcore/test_strategy.py::test_autotvm_extracts_one_task_per_distinct_hwnc_layer":
        "test_resnet50_hwnc_layers_select_tensorcore_and_first_layer_does_not[int8]",
    "python_tests/tensorcore/test_strategy.py::test_tvm_own_preparation_gives_the_same_strategy_choices[int4]":
        "its [int8]",
    "python_tests/tensorcore/test_strategy.py::test_resnet50_hwnc_layers_select_tensorcore_and_first_layer_does_not[int4]":
        "its [int8]",
    "python_tests/tensorcore/test_recast.py::test_structurally_equal_to_tvm_recast[mobilenet]": "its other models",
    "python_tests/tensorcore/test_recast.py::test_structurally_equal_to_tvm_recast[resnet-18]": "its other models",
    "python_tests/tensorcore/test_epilogue.py::test_relay_build_makes_each_layer_one_kernel[conv-large-tile-sm90]":
        "its conv-sm90 and conv-sm80",
    "python_tests/tensorcore/test_convert_layout_numerics.py::test_small_nets_compute_the_same[branchy-HWNC-skip0]":
        "its small_conv_net cases",
    "python_tests/tensorcore/test_prepare.py::test_demo_section_reports_skipped_layers_and_equal_outputs":
        "test_skipped_layers_go_to_nhwc_for_cuda_and_compute_the_same",
    "python_tests/bench/test_gpu_check.py::test_tune_rehearsal_builds_finds_the_task_and_a_runner_that_has_cuda":
        "test_mma_gemm's relay build on verified archs",
    # Whole-model int8 checks with a lighter sibling on the same path.
    "python_tests/dotprod/test_qdq.py::test_qdq_convs_run_on_dot_product_schedules_and_match[qdq_channel]":
        "its [qdq_tensor] and test_plain_build_of_a_residual_block_equals_to_integer",
    "python_tests/dotprod/test_qdq.py::test_bench_command_on_a_qdq_file": "test_qoperator_file_on_dot_product_schedules",
    "python_tests/dotprod/test_hooks.py::test_int8_model_bit_exact_vs_tvm_generic[vnni-odd_int8_weights_as_inputs]":
        "its [vnni-odd_int8]",
    "python_tests/dotprod/test_prefetch.py::test_each_block_prefetches_the_next_blocks_lines[3x3-False]":
        "its 1x1 cases",
    "python_tests/dotprod/test_hexagon_model.py::test_relay_quantize_encoder_names_the_operators_without_c_form":
        "test_quantized_cnn_bit_exact_against_x86",
    "python_tests/test_onnx_quantize_dynamic.py::test_quantize_dynamic_models_match_onnxruntime[cnn-QUInt8-False]":
        "its other cases",
    "python_tests/test_doc_snippets.py::test_snippet_runs[README.md-2]": "the README's other snippets",
    # Faults whose mechanism a shorter test covers (they wait out real timeouts).
    "python_tests/test_processes.py::test_nothing_of_a_killed_tune_command_runs_10_s_later":
        "test_collage_memory's test_workers_die_with_their_parent",
    "python_tests/test_rpc_faults.py::test_a_server_killed_mid_search_costs_a_retry_not_an_infinite_cost":
        "the other server faults of test_rpc_faults",
    "python_tests/test_tuning_log.py::test_tune_resumes_after_a_cut_last_line":
        "test_damaged_log_keeps_readable_records_and_names_the_file",
    "python_tests/collage/test_collage_measured.py::test_crashing_and_hanging_toolchains_cost_infinity":
        "test_an_isolated_module_that_fails_to_build_or_dies_raises_runtime_error",
    "python_tests/collage/test_collage_measured.py::test_workers_measuring_side_by_side_are_pinned_to_disjoint_cores[recycled]":
        "its other case",
    "python_tests/collage/test_collage_memory.py::test_payloads_carry_no_weights_and_shared_constants_are_written_once":
        "test_collage_memory's payload size checks",
    "python_tests/collage/test_collage_memory.py::test_a_worker_grown_past_the_limit_is_replaced_between_tasks":
        "test_a_worker_over_the_limit_gives_back_its_garbage_before_it_is_replaced",
    "python_tests/collage/test_collage_cli.py::test_collage_cli_retry_failed_measures_cached_failures_again":
        "test_collage_cli_partitions_saves_and_draws",
    "python_tests/collage/test_collage_original.py::test_every_contender_and_the_file_is_timed_in_a_process_of_its_own":
        "test_a_benchmark_search_times_the_runtimes_on_the_users_file_where_there_is_one",
    "python_tests/test_rpc_collage.py::test_measured_search_on_two_servers_matches_a_local_search":
        "test_whole_models_are_validated_and_compared_on_the_servers",
    # Second cut (the first left the run at 666 s on the Ice Lake VM): more variants and secondary paths.
    "tvm_tcutils/collage/cost/workers.py::tvm_tcutils.collage.cost.workers.IsolatedSampler":
        "test_collage_measured's isolated-module tests",
    "python_tests/collage/test_collage_measured.py::test_validations_whole_builds_are_taken_by_the_comparison_not_built_again":
        "test_measures_once_then_reuses_the_cache",
    "python_tests/collage/test_collage_measured.py::test_tuning_log_reaches_every_tvm_build_and_the_cache_key":
        "test_collage_cli's tuned runs",
    "python_tests/collage/test_collage_measured.py::test_isolated_builds_at_once_keep_their_workers_after_the_building_threads_end":
        "test_an_isolated_module_that_fails_to_build_or_dies_raises_runtime_error",
    "python_tests/collage/test_collage_measured.py::test_costs_are_taken_for_the_host_cpu_and_cached_per_target":
        "test_measures_once_then_reuses_the_cache",
    "python_tests/collage/test_collage_measured.py::test_models_with_concatenate_are_measured": "the zoo searches",
    "python_tests/collage/test_collage_memory.py::test_a_timed_out_workers_children_are_killed":
        "test_workers_die_with_their_parent",
    "python_tests/collage/test_collage_memory.py::test_a_candidate_writing_a_mebibyte_to_stderr_is_measured":
        "test_workers_die_with_their_parent",
    "python_tests/collage/test_collage_memory.py::test_the_pool_pulls_a_task_only_when_a_worker_is_free":
        "test_a_worker_over_the_limit_gives_back_its_garbage_before_it_is_replaced",
    "python_tests/collage/test_packed_call.py::test_compiled_mixed_model_gives_the_same_results_with_and_without_parking":
        "its other parking tests",
    "python_tests/collage/test_collage_driver.py::test_prepare_folds_batch_norms_as_tvm_does_without_building_kernels[True]":
        "its [False]",
    "python_tests/collage/test_collage_int8.py::test_quantized_layer_partition_matches_tvm_within_a_step[openvino-conv]":
        "its other cases",
    "python_tests/test_rpc_collage.py::test_collage_command_through_the_tracker":
        "test_whole_models_are_validated_and_compared_on_the_servers",
    "python_tests/test_tuning_cli.py::test_tune_resume_and_apply_history_best":
        "test_tuning_log's resumable log tests",
    "python_tests/test_onnx_quantize_dynamic.py::test_dynamic_quantize_linear_equals_onnxruntime":
        "test_full_range_integer_ops_equal_numpy",
    "python_tests/test_onnx_quantize_dynamic.py::test_dynamic_quantize_linear_of_a_wide_input_splits_its_tree_for_the_build":
        "test_dynamic_quantize_linear_takes_min_and_max_in_one_kernel",
    "python_tests/test_onnx_quantize_dynamic.py::test_dynamic_quantize_linear_takes_min_and_max_in_one_kernel[768]":
        "its other width",
    "python_tests/test_onnx_quantize_dynamic.py::test_quantize_dynamic_models_reach_the_dot_product_kernels[cnn-QUInt8-ops1]":
        "its other cases",
    "python_tests/test_onnx_import.py::test_numpy_folds_after_alter_layout_build_the_same_module_without_compiling_constants":
        "test_collage_driver's folding tests",
    "python_tests/test_doc_snippets.py::test_snippet_runs[docs/dotprod.md-1]": "the other snippets",
    "python_tests/test_doc_snippets.py::test_snippet_runs[docs/dotprod.md-2]": "the other snippets",
    "python_tests/dotprod/test_qdq.py::test_tuning_tasks_of_a_qdq_file_are_its_integer_convs":
        "test_hooks' tuning of the RGB stem",
    "python_tests/dotprod/test_qdq.py::test_residual_add_reads_the_conv_result_before_its_8_bit_cast[True]": "its [False]",
    "python_tests/dotprod/test_hooks.py::test_int8_model_bit_exact_vs_tvm_generic[vnni-qnn]": "its [vnni-quantized]",
    "python_tests/dotprod/test_hooks.py::test_rgb_stem_is_extracted_and_tuned_in_the_row_form_the_build_runs[vnni-uint8]":
        "its [avx2-uint8]",
    "python_tests/dotprod/test_hooks.py::test_rgb_stem_reduces_kernel_rows_in_quads": "the RGB stem's bit-exact models",
    "python_tests/dotprod/test_hexagon_model.py::test_differential_run_names_the_first_node_that_differs":
        "test_quantized_cnn_bit_exact_against_x86",
    "python_tests/dotprod/test_prefetch.py::test_each_block_prefetches_the_next_blocks_lines[1x1_k512-False]":
        "its [1x1_tiles-True]",
    "python_tests/dotprod/test_depthwise.py::test_plain_relay_build_takes_it_for_a_quantized_depthwise_conv[kernel_zero_point]":
        "its 3x3 cases",
    "python_tests/dotprod/test_reduce_range.py::test_reduce_range_weights_take_the_8bit_step_bit_exactly[uint8-conv2d]":
        "its int8 cases",
    "python_tests/tensorcore/test_convert_layout_numerics.py::test_back_to_nchw_computes_the_same":
        "test_small_nets_compute_the_same",
    "python_tests/tensorcore/test_convert_layout_numerics.py::test_small_nets_compute_the_same[small_conv_net-HWNC-skip3]":
        "its cheapest case",
    "python_tests/tensorcore/test_recast.py::test_structurally_equal_to_tvm_recast[squeezenet1.1]": "its cheapest model",
    "python_tests/tensorcore/test_recast.py::test_tvm_numbering_returns_what_tvm_recast_returns[squeezenet1.1]":
        "its other model",
    "python_tests/tensorcore/test_prepare.py::test_skipped_layers_go_to_nhwc_for_cuda_and_compute_the_same[None-NHWC-want3]":
        "its auto and keep cases",
    "python_tests/tensorcore/test_mma_conv2d.py::test_relay_build_takes_the_kernel_on_verified_archs_only":
        "test_mma_gemm's",
    "python_tests/tensorcore/test_wgmma_gemm.py::test_relay_build_takes_the_kernel_on_verified_archs_only":
        "test_mma_gemm's",
    "python_tests/tensorcore/test_epilogue.py::test_relay_build_makes_each_layer_one_kernel[conv-padded-rows-sm90]":
        "its conv-sm90",
    "python_tests/tensorcore/test_rules_agreement.py::test_auto_skips_exactly_what_the_strategy_keeps_off_tensor_cores[50-8-int8]":
        "its batch-1 cases",
    "python_tests/tensorcore/test_deep_graphs.py::test_deep_layer_chain[1500]": "its shorter chains",
    "python_tests/tensorcore/test_layout_config.py::test_qnn_conv2d_in_hwnc_computes_the_same":
        "test_convert_layout_numerics",
    # Third cut (the second left `.ci/run` at 8-9 minutes on the Ice Lake VM: a margin for its noisy spells).
    "python_tests/dotprod/test_qdq.py::test_matmul_of_activations": "test_batch_matmul's exact kernels",
    "python_tests/dotprod/test_pipeline.py::test_plain_relay_build_of_a_residual_block_same_output":
        "test_qdq's test_plain_build_of_a_residual_block_equals_to_integer",
    "python_tests/dotprod/test_hexagon_model.py::test_c_build_applies_the_package_hooks":
        "test_quantized_cnn_bit_exact_against_x86",
    "python_tests/dotprod/test_depthwise.py::test_plain_relay_build_takes_it_for_a_quantized_depthwise_conv[3x3]":
        "its [3x3_asym]",
    "python_tests/test_models_onnx.py::test_small_bert_imports_into_relay_with_the_same_numerics":
        "test_encoder_routes' quantized encoders",
    "python_tests/tensorcore/test_recast.py::test_numerics_follow_the_cast": "test_structurally_equal_to_tvm_recast",
    "python_tests/tensorcore/test_rules_agreement.py::test_auto_skips_exactly_what_the_strategy_keeps_off_tensor_cores[50-1-int4]":
        "its other batch-1 case",
    "python_tests/tensorcore/test_sass.py::test_relay_conv2d_and_dense_compile_to_integer_mma[int8-sm_75]":
        "its int4-sm_75 and int8-sm_90",
    "python_tests/collage/test_collage_measured.py::test_validation_times_a_module_with_the_builds_in_flight_stopped":
        "test_workers_measuring_side_by_side_are_pinned_to_disjoint_cores",
    "tvm_tcutils/collage/cost/workers.py::tvm_tcutils.collage.cost.workers.PooledWholeModelTimer":
        "test_collage_measured's pooled timings",
    "tvm_tcutils/collage/cost/workers.py::tvm_tcutils.collage.cost.workers.WorkerPool":
        "test_collage_memory's pool tests",
}


#: The fault-injection suite (issue 20): modules that damage caches, logs and model
#: files, kill workers and parents, flood pipes. Marked ``faults`` so that
#: ``pytest -m faults`` runs them alone; they are fast enough to stay in the default run.
FAULT_MODULES = frozenset({
    "test_cost_store.py", "test_tuning_log.py", "test_model_files.py", "test_processes.py",
    "test_collage_memory.py", "test_cli_errors.py", "test_rpc_faults.py",
})


def pytest_configure(config):
    # Parallel workers (scripts/test.sh runs two): each gets one TVM thread so that two pools do
    # not spin against each other on a 2-core machine; tests that need a thread count set their own.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("TVM_NUM_THREADS", "1")


#: The test files that take longest (seconds of a full run on 2 cores, heaviest first), relative to the
#: checkout. They are collected first, and scripts/test.sh hands files to its two workers in collection
#: order (``--dist loadfile --no-loadscope-reorder``): the last files handed out are then short ones, and
#: neither worker waits idle at the end while the other runs a minute-long file (pytest-xdist's own order,
#: by the number of tests in a file, put several of these last).
SLOW_FILES = (
    "python_tests/collage/test_collage_measured.py",
    "python_tests/dotprod/test_qdq.py",
    "python_tests/dotprod/test_hooks.py",
    "python_tests/tensorcore/test_sass.py",
    "python_tests/collage/test_collage_memory.py",
    "python_tests/test_rpc_collage.py",
    "python_tests/dotprod/test_amx.py",
    "python_tests/test_doc_snippets.py",
    "python_tests/test_onnx_quantize_dynamic.py",
    "python_tests/test_tuning_log.py",
    "python_tests/tensorcore/test_strategy.py",
    "python_tests/test_rpc_faults.py",
    "python_tests/dotprod/test_int8_op_sweep.py",
    "python_tests/test_invariants.py",
    "python_tests/dotprod/test_hexagon_model.py",
    "python_tests/test_onnx_import.py",
)


def _slow_rank(item) -> int:
    path = os.path.relpath(str(item.path), ROOT).replace(os.sep, "/")
    return _SLOW_RANK.get(path, len(SLOW_FILES))


_SLOW_RANK = {path: rank for rank, path in enumerate(SLOW_FILES)}


def pytest_collection_modifyitems(config, items):
    # Stable: a file's tests stay together and in their order (module-scoped fixtures are built once).
    items.sort(key=_slow_rank)
    selected = config.getoption("-m") or ""
    for item in items:
        if item.path.name in FAULT_MODULES:
            item.add_marker(pytest.mark.faults)
        node = item.nodeid.replace(os.sep, "/")
        if node in SLOW_IN_DEFAULT_RUN or node.split("[")[0] in SLOW_IN_DEFAULT_RUN:
            item.add_marker(pytest.mark.slow)
        for marker, reason in OPT_IN_MARKERS.items():
            if item.get_closest_marker(marker) is not None and marker not in selected:
                item.add_marker(pytest.mark.skip(reason=reason))


def _child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


_SERVER: list = []  # the fork server (python_tests/_fork_server.py), started on first use


def _fork_server() -> subprocess.Popen:
    if not _SERVER or _SERVER[0].poll() is not None:
        server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fork_server.py")
        # Unbuffered (bytes): a buffered reader could take the "status" line along with the "pid" line,
        # and select() on the pipe would then wait the whole timeout for a line already read.
        _SERVER[:] = [subprocess.Popen([sys.executable, server], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       bufsize=0, env=_child_env())]
    return _SERVER[0]


def _run_forked(kind: str, payload, env: dict, cwd: str | None, timeout: float, args) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(args)``, in a child of the fork server (TVM and the package already imported)."""
    import select
    import signal
    import tempfile

    server = _fork_server()
    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        out_path, err_path = os.path.join(folder, "out"), os.path.join(folder, "err")
        request = dict(kind=kind, payload=payload, env=env, cwd=cwd, out=out_path, err=err_path)
        line = (json.dumps(request) + "\n").encode()
        while line:
            line = line[server.stdin.write(line):]
        pid = int(server.stdout.readline().split()[1])  # byte by byte: the next line stays in the pipe
        ready, _, _ = select.select([server.stdout], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        status = int(server.stdout.readline().split()[1])
        if not ready:
            raise subprocess.TimeoutExpired(args, timeout)
        with open(out_path, errors="replace") as out, open(err_path, errors="replace") as err:
            return subprocess.CompletedProcess(args, status, out.read(), err.read())


def each_value_once(*axes: Sequence, ids: Sequence[Callable] = ()) -> list:
    """The product of ``axes`` as ``pytest.param`` cases: each value of each axis runs by default, the
    rest of the product under ``-m slow``.

    Default case ``t`` takes value ``t % len(axis)`` of every axis, for ``t`` below the longest axis'
    length: as many default cases as that axis has values, and every value of every axis among them.
    ``ids[i](value)`` names axis ``i``'s values (default: a tuple's items joined by ``x``, else ``str``).
    """
    def name_of(value) -> str:
        return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)

    longest = max(len(axis) for axis in axes)
    default = {tuple(t % len(axis) for axis in axes) for t in range(longest)}
    cases = []
    for index in itertools.product(*(range(len(axis)) for axis in axes)):
        values = [axis[i] for axis, i in zip(axes, index)]
        name = "-".join((ids[n] if n < len(ids) else name_of)(value) for n, value in enumerate(values))
        cases.append(pytest.param(*values, id=name, marks=[] if index in default else [pytest.mark.slow]))
    return cases


def run_python(
    code: str, env: dict | None = None, timeout: int = 300, cwd: str | None = None, fresh: bool = True,
    unset: tuple = (),
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this checkout first on the path.

    ``fresh=False``: in a process forked from one that has already imported TVM and the
    package (seconds faster); only for code that imports the package itself anyway.
    ``env``: variables set for the run; ``unset``: names taken out of its environment.
    """
    child_env = {k: v for k, v in _child_env(env).items() if k not in unset}
    if not fresh:
        return _run_forked("python", code, child_env, cwd, timeout, [sys.executable, "-c", code])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=timeout, cwd=cwd
    )


def run_cli(*args: str, cwd: str | None = None, timeout: int = 600, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run ``tvm-tcutils ARGS`` in a process of its own.

    By default the process is forked from one that has TVM and the package imported
    (what ``python -m tvm_tcutils`` does first); ``fresh=True`` starts a new interpreter,
    for tests of what the user waits for, TVM's import included.
    """
    command = [sys.executable, "-m", "tvm_tcutils", *args]
    if not fresh:
        return _run_forked("cli", args, _child_env(), cwd, timeout, command)
    return subprocess.run(command, capture_output=True, text=True, env=_child_env(), cwd=cwd, timeout=timeout)


# --------------------------------------------------------------------------
# CUDA: code generation and SASS without a GPU, numerics where one is.
# --------------------------------------------------------------------------
#: An instruction's opcode (predicate and operands stripped) in cuobjdump's SASS listing.
SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Za-z0-9_.]*)")


@functools.lru_cache(maxsize=None)
def cuda_status() -> dict:
    """:func:`tvm_tcutils.cuda.status`, asked once per process."""
    from tvm_tcutils import cuda

    return cuda.status()


def needs_cuda_codegen(test):
    """Skip ``test`` (with the reason) where CUDA cannot be compiled or its SASS read back."""
    from tvm_tcutils import cuda

    status = cuda_status()
    test = pytest.mark.skipif(not status["codegen"], reason=f"no CUDA code generation here: {status['reason']}")(test)
    return pytest.mark.skipif(cuda.tool("cuobjdump") is None,
                              reason="cuobjdump is not in the CUDA toolkit (pip install 'tvm-tcutils[cuda]')")(test)


def sass_opcodes(module) -> dict:
    """{kernel name: Counter of its SASS opcodes} of a built CUDA ``module`` (or a cubin's bytes)."""
    from collections import Counter

    from tvm_tcutils import cuda

    cubin = module if isinstance(module, (bytes, bytearray)) else cuda.module_cubin(module)
    return {name: Counter(SASS_OPCODE.findall(code)) for name, code in cuda.sass(cubin).items()}


def gpu_arch(min_arch: int = 0) -> str:
    """The GPU's ``sm_XY``, or a skip: no code generation, no GPU, or one older than ``sm_<min_arch>``."""
    status = cuda_status()
    if not status["codegen"]:
        pytest.skip(f"no CUDA code generation here: {status['reason']}")
    if not status["device"]:
        pytest.skip("no GPU here: the kernel's numbers come from a machine with one (scripts/gpu_check.sh)")
    arch = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    if int(arch[3:]) < min_arch:
        pytest.skip(f"the GPU is {arch}: this kernel needs sm_{min_arch}+")
    return arch


@pytest.fixture(scope="session")
def mlp_model():
    """The zoo MLP (type-checked module, params)."""
    return tvm_tcutils.load_model("mlp")


@pytest.fixture(scope="session")
def int8_mlp():
    """The zoo MLP quantized to int8 by the package (``quantize_int8``): the tuning tests' model (quantizing
    it takes most of a second; the module is never changed by the tuning functions that read it)."""
    from tvm_tcutils.dotprod.quantize import quantize_int8

    return quantize_int8(*tvm_tcutils.load_model("mlp"))


@pytest.fixture(scope="session")
def resnet18_model():
    """ResNet-18 with realistic weights."""
    return tvm_tcutils.load_model("resnet-18")


def small_conv_net(channels: int = 16, size: int = 16, dtype: str = "float32"):
    """conv-bias-relu x2 with a residual add and pooling: a small model with every common neighbour op."""
    x = relay.var("data", shape=(1, channels, size, size), dtype=dtype)
    rng = np.random.default_rng(0)

    def const(shape):
        return relay.const(rng.standard_normal(shape).astype(dtype) * 0.1)

    y = relay.nn.conv2d(x, const((channels, channels, 3, 3)), padding=(1, 1), channels=channels, kernel_size=(3, 3))
    y = relay.nn.relu(relay.nn.bias_add(y, const((channels,))))
    z = relay.nn.conv2d(y, const((channels, channels, 3, 3)), padding=(1, 1), channels=channels, kernel_size=(3, 3))
    z = relay.nn.relu(relay.add(z, y))
    z = relay.nn.max_pool2d(z, pool_size=(2, 2), strides=(2, 2))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], z)))


@pytest.fixture
def small_conv():
    return small_conv_net()


def conv_chain(layers: int, channels: int = 4, size: int = 4, dtype: str = "float32"):
    """A ``layers``-deep conv2d+relu chain (one shared weight), as an untyped IRModule; for deep-graph tests."""
    x = relay.var("data", shape=(1, channels, size, size), dtype=dtype)
    weight = relay.const(np.full((channels, channels, 3, 3), 1.0 / (9 * channels), dtype=dtype))
    y = x
    for _ in range(layers):
        y = relay.nn.relu(relay.nn.conv2d(y, weight, padding=(1, 1), channels=channels, kernel_size=(3, 3)))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def op_names(expr) -> list:
    """Names of the operators ``expr`` (a Relay expression or function) calls, in post order."""
    found = []
    relay.analysis.post_order_visit(expr, lambda e: found.append(e.op.name) if isinstance(
        e, relay.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def build_and_run(mod, params=None, inputs=None, target: str = "llvm"):
    """Build ``mod`` for ``target`` at opt_level 3, run it once on the CPU; returns the list of outputs."""
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**(inputs or {}))
    runner.run()
    return [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]


def build_run_lib(mod, inputs: dict, target: str, opt_level: int = 3):
    """Build ``mod`` (an IRModule or a Relay function) at ``opt_level``, run it once on the CPU; returns
    ``(first output as numpy, the built library)``."""
    from tvm.contrib import graph_executor

    if isinstance(mod, relay.Function):
        mod = tvm.IRModule.from_expr(mod)
    with tvm.transform.PassContext(opt_level=opt_level):
        lib = relay.build(mod, target=target)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**inputs)
    runner.run()
    return runner.get_output(0).numpy(), lib


def run_graph_and_vm(mod, inputs: dict, params: dict | None = None):
    """Build ``mod`` with relay.build and relay.vm.compile; return both executors' first outputs (numpy)."""
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", params=params)
        exe = relay.vm.compile(mod, target="llvm", params=params)
    graph = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    graph.set_input(**inputs)
    graph.run()
    vm = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu())
    names = [var.name_hint for var in mod["main"].params if var.name_hint in inputs]
    vm_out = vm.invoke("main", *[inputs[name] for name in names])
    return graph.get_output(0).numpy(), vm_out.numpy()


@pytest.fixture(scope="session")
def small_bert_onnx():
    """A one-layer BERT-like ONNX graph (seq 16, hidden 32, 2 heads) and its Relay import (mod, params)."""
    pytest.importorskip("onnx", reason="onnx is not installed")
    from tvm_tcutils import models

    model = models.bert_onnx(layers=1, seq=16, hidden=32, heads=2)
    mod, params = relay.frontend.from_onnx(model, freeze_params=True)
    return model, relay.transform.InferType()(mod), params


@contextlib.contextmanager
def counted_relay_builds():
    """Inside, each kernel build TVM's ``relay.backend.build`` does (``FoldConstant`` compiles one per folded
    call) is counted in the yielded list; the function is TVM's again on leaving."""
    builds: list = []
    build = tvm.get_global_func("relay.backend.build")

    def counted(*args):
        builds.append(1)
        return build(*args)

    tvm.register_func("relay.backend.build", counted, override=True)
    try:
        yield builds
    finally:
        tvm.register_func("relay.backend.build", build, override=True)


def host_cpu_has(*features: str) -> bool:
    """Whether this machine's CPU has all ``features`` (as LLVM reads CPUID: a VM may hide some)."""
    target = tvm.target.Target(tvm_tcutils.host_target())
    return bool(tvm.target.codegen.target_has_features(list(features), target))


def runtime_exact_weight_bound() -> int:
    """The largest ``|w|`` of an int8 weight that onnxruntime's and OpenVINO's u8 x s8 kernels multiply
    exactly on this CPU: 127 where it has VNNI (``vpdpbusd``); 64 elsewhere, since on AVX2 and SSE both
    runtimes multiply with ``vpmaddubsw``, whose int16 pair sums saturate beyond ``2 * 255 * 64``
    (onnxruntime's ``reduce_range`` weights fit; full-range ones were 22-66 steps off on a Zen 3).
    Tests that compare the package's integer results with those runtimes draw weights within it."""
    return 127 if host_cpu_has("avx512vnni") or host_cpu_has("avxvnni") else 64


#: x86 dot-product targets to test, each with the CPU feature it needs to run here.
DOT_TARGETS = {
    "vnni": ("llvm -mcpu=znver4", "avx512vnni"),
    # Zen 5's code (its wider fallback tiles where it runs); vp2intersect is a Zen 5 feature Zen 4 lacks.
    "vnni_zen5": ("llvm -mcpu=znver5", "avx512vp2intersect"),
    "avx2": ("llvm -mcpu=core-avx2", "avx2"),
    "sse": ("llvm -mcpu=nehalem", "sse4.2"),
}


def dot_target_runs(name: str) -> bool:
    """Whether this CPU runs the code of the :data:`DOT_TARGETS` entry ``name``."""
    return host_cpu_has(DOT_TARGETS[name][1])


def dot_target(name: str) -> str:
    """The target string of a :data:`DOT_TARGETS` entry; skips when this CPU cannot run it."""
    target, feature = DOT_TARGETS[name]
    if not dot_target_runs(name):
        pytest.skip(f"this CPU has no {feature}: cannot run {target} code")
    return target


#: Adding it rounds a float32 below 2**22 to an integer, ties to even.
ROUNDING_SHIFT = 1.5 * 2**23


def requantized_conv(data_shape, kernel_shape, padding: int, residual: bool, rounded_first: bool = False,
                     kernel_dtype: str = "int8"):
    """The package's NCHW16c dot-product conv (fallback config, current target) with the epilogue the QDQ
    rewrite fuses after it: bias, scale, clip, round, 8 bits, and optionally a residual add read from a
    second 8-bit tensor (``rounded_first``: added to the conv's own clamped and rounded value, back in
    float32, as a QDQ residual add reads it; ``kernel_dtype`` int16: a kernel packed widened, as AVX2 takes
    it). Returns ``(cfg, out, args)``."""
    from tvm import autotvm, te, tir
    from tvm_tcutils.dotprod.topi.conv2d_nchwc import conv2d_nchwc_dot

    data, kernel = te.placeholder(data_shape, "uint8", "data"), te.placeholder(kernel_shape, kernel_dtype, "kernel")
    cfg = autotvm.get_config()
    conv = conv2d_nchwc_dot(cfg, data, kernel, 1, padding, 1, "NCHW16c", "NCHW16c")
    bias = te.placeholder((conv.shape[1], conv.shape[4]), "int32", "bias")
    other = te.placeholder(conv.shape, "uint8", "other")

    def rounded(value, dtype):
        clipped = te.max(te.min(value, tir.const(127.0, "float32")), tir.const(-128.0, "float32"))
        # Rounded half to even as fast_forms.rounded_int32 does (TVM vectorizes it; nearbyint it scalarizes).
        shifted = tir.reinterpret("int32", clipped + tir.const(ROUNDING_SHIFT, "float32"))
        return (shifted - tir.const(int(np.float32(ROUNDING_SHIFT).view("int32")), "int32")).astype(dtype)

    def epilogue(n, c, y, x, b):
        value = (conv[n, c, y, x, b] + bias[c, b]).astype("float32") * tir.const(0.00037, "float32")
        if residual:
            if rounded_first:
                value = rounded(value, "float32") * tir.const(0.75, "float32")
            value = value + (other[n, c, y, x, b].astype("float32") - tir.const(129.0, "float32")) * 0.5
        return rounded(value, "int8")

    out = te.compute(conv.shape, epilogue, name="requantized", tag="elemwise")
    return cfg, out, [data, kernel, bias] + ([other] if residual else []) + [out]


def tvm_codegen():
    """A scope in which ``target.build.llvm`` is TVM's own, without the package's kernel rewrites."""
    from tvm_tcutils import registry
    from tvm_tcutils.dotprod import hooks

    return registry.overriding_func(hooks.BUILD_LLVM, registry.replaced_func(hooks.BUILD_LLVM))


def codegen_and_hook_builds(schedule, args, target: str, rng) -> tuple:
    """``(outputs, asm)``: a :func:`requantized_conv` schedule built by TVM's own ``target.build.llvm``
    (:func:`tvm_codegen`) and by the package's hook, each run on the same random inputs (first TVM's,
    then the hook's). The outputs must be equal and varied: asserted here."""
    inputs = requantized_conv_inputs(args, rng)
    outputs, asm = [], []
    for scope in (tvm_codegen, contextlib.nullcontext):
        with scope():
            func = tvm.build(schedule, args, target)
        asm.append(func.get_source("asm"))
        arrays = [tvm.nd.array(x) for x in inputs] + [tvm.nd.empty([int(d) for d in args[-1].shape], "int8")]
        func(*arrays)
        outputs.append(arrays[-1].numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert np.unique(outputs[1]).size > 16
    return outputs, asm


def requantized_conv_inputs(args, rng) -> list:
    """Random inputs for :func:`requantized_conv`'s ``args`` (all but the output)."""
    ranges = {"uint8": (0, 256), "int8": (-128, 128), "int16": (-128, 128), "int32": (-3000, 3000)}
    return [rng.integers(*ranges[a.dtype], [int(d) for d in a.shape]).astype(a.dtype) for a in args[:-1]]


def host_dot_target() -> str:
    """This CPU's own target (:func:`tvm_tcutils.host_target`) when it has an x86 dot-product ISA; else skips.

    Tests that run the package's int8 kernels end to end use it, so that they run here whatever
    the machine's vector ISA (VNNI, AVX2 or SSE4.2) instead of only on one kind of CPU.
    """
    from tvm_tcutils.dotprod.isa import for_target

    target = tvm_tcutils.host_target()
    isa = for_target(target)
    if isa is None or not isa.name.startswith("x86"):
        pytest.skip(f"this CPU ({target}) has no x86 4-way dot-product ISA the package supports")
    return target


@pytest.fixture(scope="session")
def int8_conv_tuning(tmp_path_factory):
    """A 2-trial AutoTVM session of an int8 one-task conv net on this CPU: (module, log path, summary).

    ``test_tuning_cli.py`` checks the session itself (its summary and records) and ``test_tuning_log.py``
    damages copies of its log: one tuning (its build and measuring pools, the runner's tracker and server:
    seconds of process start-up) serves both. The log is read-only: a test that tunes on or appends copies
    it first.

    With ``pytest -n`` (scripts/test.sh) the two files usually land on different workers: the first worker
    to ask tunes, under a lock in the run's shared temporary folder, and the other reads its log and summary.
    """
    import fcntl

    from tvm_tcutils import tuning
    from tvm_tcutils.dotprod import quantize

    mod = quantize.quantize_int8(small_conv_net(channels=16, size=8), {})
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder = root / "int8-tuning-shared"
    folder.mkdir(exist_ok=True)
    log, done = str(folder / "clean.log"), folder / "summary.json"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                if os.path.exists(log):
                    os.remove(log)  # a worker that failed to tune left a partial log: start afresh
                summary = tuning.tune(mod, {}, host_dot_target(), trials=2, log=log, progress=False, measure_number=1)
                done.write_text(json.dumps(summary))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return mod, log, [tuple(row) for row in json.loads(done.read_text())]


@pytest.fixture(scope="session")
def rpc_cluster():
    """A real RPC tracker and two ``tvm_tcutils.rpc_server`` servers (key ``tcutils-test``) on free localhost ports.

    Shared by the tests that use it (starting them takes seconds under load); always torn down,
    and each process dies with the test process. Tests that kill a server start their own cluster.
    """
    from tvm_tcutils.bench.rpc import LocalCluster

    with LocalCluster("tcutils-test", servers=2) as cluster:
        yield cluster


def with_mattr(target: str, *features: str) -> str:
    """``target`` with ``features`` (``+name`` / ``-name``) added to its ``-mattr``.

    A tile kernel in the reference form built for the host CPU plus the AMX features runs on any x86
    host: the features only choose the kernel, the code holds no tile instruction."""
    extra = ",".join(features)
    head, sep, rest = target.partition(" -mattr=")
    if not sep:
        return f"{target} -mattr={extra}"
    # After the existing ones: LLVM takes the last word on a feature.
    attrs, space, tail = rest.partition(" ")
    return f"{head} -mattr={attrs},{extra}{space}{tail}"


def amx_runs_here() -> str:
    """Skips unless this process may run AMX tile kernels; else this CPU's target."""
    from tvm_tcutils.dotprod import amx

    state = amx.state()
    if not state.usable:
        pytest.skip(f"AMX tile kernels cannot run here: {state.reason}")
    return tvm_tcutils.host_target()
