"""Which host loop a training run runs, decided before its first step: a `LoopPlan`.

A model's batches come through tf.data or, for a model with `train_arrays`, from device
data (`tpurun.inputs.device_data`: the arrays in every replica's memory, each replica
step gathering its own batch) unless config.train.device_data=false or the arrays are
too large (`device_data_for`, said in one line). `tpurun check` asks the same question
for the train step it checks. On device data the host loop is compiled by XLA as a
whole, or not (`decide`, which says why).

The Trainer holds the plan (`tpurun.runners.train`); the loops themselves are
`tpurun.runners.host_loops`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from absl import logging

from tpurun.cluster import Cluster, device_kind
from tpurun.inputs import device_data
from tpurun.inputs.device_data import DeviceData
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import TrainArrays
from tpurun.run_config import RunConfig
from tpurun.runners import host_loops
from tpurun.runners.host_loops import DeviceLoop, LoopParts, LoopTimes


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """The host loop a training run runs; the default is the loop over tf.data."""

    # The in-memory arrays each replica step gathers its batch from (None: tf.data).
    device_data: DeviceData | None = None
    # The device-data loops' times the run chose its loop by: what model_dir's record
    # keeps, so that a resumed run runs the same loop. None: not chosen by timing.
    loop_times: LoopTimes | None = None
    # The loop chosen was compiled already, to time it: the first host loop compiles nothing.
    compiled: bool = False


def device_data_for(run: RunConfig, cluster: Cluster, arrays: TrainArrays) -> DeviceData | None:
    """The device data a run on `cluster` trains on from `arrays`, not yet placed in the
    replicas' memory; None when it is off or too large (said in one line): then the arrays
    go through tf.data."""
    if not run.config.train.device_data:
        device_data.log_fallback("config.train.device_data=false")
        return None
    order = ExampleOrder(arrays.num_examples, run.seed)
    reason = device_data.why_not(arrays, order, cluster, run.config.train.device_data_mb)
    if reason:
        device_data.log_fallback(reason)
        return None
    return DeviceData(
        arrays,
        order,
        cluster.strategy.num_replicas_in_sync,
        run.train_batch_size,
        run.config.train.accumulate_steps,
    )


def decide(
    run: RunConfig,
    cluster: Cluster,
    arrays: TrainArrays | None,
    parts: LoopParts,
    step: int,
    recorded: Callable[[], LoopTimes | None],
) -> tuple[LoopPlan, DeviceLoop | None]:
    """The plan of a run at global step `step`, and its device-data host loop over `parts`
    with the arrays placed in the replicas' memory (None: the loop is over tf.data, the
    input the caller builds).

    `recorded`: the loop times model_dir's record kept, read only when the run decides
    between the device-data loops by them.
    """
    data = device_data_for(run, cluster, arrays) if arrays is not None else None
    if arrays is None or data is None:
        return LoopPlan(), None
    data.place(cluster.strategy)
    plan, loop = _device_loop(run, cluster, parts, data, step, recorded)
    logging.info(
        "Training data on the device (%s): each replica step gathers its own batch; %s.",
        device_data.describe(arrays, data.order),
        loop.describe(),
    )
    return plan, loop


def _device_loop(
    run: RunConfig,
    cluster: Cluster,
    parts: LoopParts,
    data: DeviceData,
    step: int,
    recorded: Callable[[], LoopTimes | None],
) -> tuple[LoopPlan, DeviceLoop]:
    """The device-data host loop: XLA-compiled as a whole or not, and why (logged).

    What cannot be compiled as one computation is not (a TPU's step is anyway, several
    replicas span several devices); the user's config.train.xla=true or false is kept.
    With "auto" (the default) a run of at most SHORT_RUN_STEPS steps runs the plain
    loop (XLA's compile would cost more than it saves). A longer one times the loops
    on the model's own step
    (`DeviceLoop.time_both`) and XLA's runs unless the plain one is clearly faster
    (`LoopTimes.measured`): XLA speeds up a step of many small ops (Iris: ~5x, its
    dispatch gone) and slows down one of large matmuls or convolutions on a CPU, where
    TensorFlow's oneDNN kernels beat XLA's (keras-io's DCGAN, a WGAN-GP of 512-unit
    layers: docs/benchmarks.md). The op mix alone does not tell the two apart, the
    step's time does. The choice is recorded in model_dir (`loop_times`): a resumed
    run runs the loop its checkpoints were trained with, for the two loops round
    floating-point sums differently and a resume must be bit-identical.
    """
    choice = run.config.train.xla
    off = _without_xla(run, cluster, choice)
    if off or choice is True:
        why = off or "the host loop is compiled by XLA (config.train.xla=true)"
        return LoopPlan(data), DeviceLoop(parts, data, step, not off, why)
    auto = "config.train.xla='auto'; true or false forces one"
    kept = recorded()
    if kept is not None:
        first = f"as this model_dir's first run chose it ({kept.shown()}; {auto})"
        why = f"{_loop_name(kept)}, {first}"
        return LoopPlan(data, kept), DeviceLoop(parts, data, step, kept.use_xla, why)
    loop = DeviceLoop(parts, data, step, False, "")
    run_steps = run.train_steps - step
    if run_steps <= host_loops.SHORT_RUN_STEPS:
        plan = LoopPlan(data, LoopTimes.short_run(run_steps))
    else:
        plan = LoopPlan(data, loop.time_both(), compiled=True)  # the loop chosen was, to time it
    assert plan.loop_times is not None
    loop.why = f"{_loop_name(plan.loop_times)}: {plan.loop_times.shown()} ({auto})"
    return plan, loop


def _without_xla(run: RunConfig, cluster: Cluster, choice: object) -> str:
    """Why the device-data host loop cannot or will not be compiled by XLA ("": it may)."""
    if cluster.is_tpu:
        return "XLA compiles the replicated step for the TPU"
    if cluster.strategy.num_replicas_in_sync > 1:
        # The all-reduce and the mirrored variables' updates span every replica's
        # device; each replica's ops are dispatched one by one (docs/benchmarks.md).
        return (
            "the host loop is not compiled by XLA: it spans every replica's device, and "
            "XLA compiles for one"
        )
    if choice is False:
        return "the host loop is not compiled by XLA (config.train.xla=false)"
    if (
        choice is not True  # "auto"
        and run.config.precision == "mixed_bfloat16"
        and device_kind(cluster.strategy) == "CPU"
    ):
        # Measured on Shakespeare's LSTM: 5x slower than TensorFlow's kernels (docs/device-data.md).
        return (
            "the host loop is not compiled by XLA: its CPU backend has no fast bfloat16 "
            "matmuls (config.train.xla=true forces it)"
        )
    return ""


def _loop_name(times: LoopTimes) -> str:
    return (
        "the host loop is compiled by XLA"
        if times.use_xla
        else "the host loop is not compiled by XLA"
    )
