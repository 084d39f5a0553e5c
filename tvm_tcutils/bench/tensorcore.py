"""The tensor-core benchmark: our HWNC conv2d template against TVM's own, per ResNet-50 layer, on one GPU.

Both are built with the same settings (the fallback config, or the best of
``trials`` AutoTVM trials with the same tuner) and timed by
:func:`tvm_tcutils.measure.time_function` on the GPU.

Examples
--------
>>> TVM_TASK
'conv2d_HWNCnc_tensorcore.cuda'
"""
from __future__ import annotations

import tempfile
from typing import Optional

import numpy as np

from .._tvm import tvm
from tvm import autotvm

from ..measure import Timing, time_function
from ..tuning import PackageLocalRunner

TVM_TASK = "conv2d_HWNCnc_tensorcore.cuda"


def cuda_target() -> str:
    """``cuda -arch=sm_XY`` of GPU 0."""
    return "cuda -arch=sm_" + str(tvm.cuda(0).compute_version).replace(".", "")


def layers(dtype: str, batch: int, target: Optional[str] = None) -> list:
    """The distinct AutoTVM workloads of ResNet-50's HWNC tensor-core conv2d layers (the 3-channel stem skipped).

    ``target`` defaults to GPU 0's (:func:`cuda_target`); name one to list them without a GPU.
    """
    from tvm.relay.testing import resnet

    from ..tensorcore import prepare_for_tensorcore
    from ..tensorcore import strategy as tensorcore

    mod, _ = resnet.get_workload(num_layers=50, batch_size=batch)
    mod, _ = prepare_for_tensorcore(mod, dtype, "int32")
    return sorted({row[4] for row in tensorcore.implementations(mod, target or cuda_target(), ("nn.conv2d",))
                   if row[3] == tensorcore.CONV2D_IMPL}, key=str)


def best_config(task, trials: int):
    """The fallback config, or the best of ``trials`` AutoTVM measurements (same tuner for both contenders)."""
    if trials <= 0:
        return autotvm.task.space.FallbackConfigEntity()
    log = tempfile.NamedTemporaryFile(suffix=".log", delete=False).name
    tuner = autotvm.tuner.XGBTuner(task, loss_type="rank")
    # The package's runner: a stock TVM server has no cuda device on a TVM without CUDA (the plugin's).
    option = autotvm.measure_option(builder=autotvm.LocalBuilder(), runner=PackageLocalRunner(number=20))
    tuner.tune(n_trial=min(trials, len(task.config_space)), measure_option=option,
               callbacks=[autotvm.callback.log_to_file(log)])
    return autotvm.task.ApplyHistoryBest(log).query(tvm.target.Target(cuda_target()), task.workload)


def time_task(task, trials: int, arrays) -> Timing:
    """Build ``task`` with :func:`best_config` and time it on GPU 0 on ``arrays`` (numpy or NDArrays)."""
    target = tvm.target.Target(cuda_target())
    with target:
        sched, tensors = task.instantiate(best_config(task, trials))
        func = tvm.build(sched, tensors, target)
    dev = tvm.cuda(0)
    return time_function(func, task_arguments(tensors, arrays, dev), repeat=5, number=50, device=dev)


def task_arguments(tensors, arrays, dev) -> list:
    """Device arguments of an instantiated AutoTVM task: its output first, then ``arrays`` (numpy or
    NDArrays) in the task's argument order, as AutoTVM's ``instantiate`` lists its tensors."""
    for tensor, array in zip(tensors[1:], arrays):
        assert tuple(int(v) for v in tensor.shape) == tuple(array.shape), (tensor.shape, array.shape)
    return [tvm.nd.empty([int(v) for v in tensors[0].shape], tensors[0].dtype, dev)] + [
        tvm.nd.array(array, dev) if isinstance(array, np.ndarray) else array.copyto(dev) for array in arrays]
