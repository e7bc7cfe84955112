"""Where a run executes: the tf.distribute strategy and a one-line description of it.

TPU when asked for (or configured/detected), else local: MirroredStrategy over
GPUs or over logical CPU devices (so `--num_shards=8` on a laptop has the 8
replicas of a v3-8), and the default strategy for a single device, which is
about 2.5x faster per step than MirroredStrategy over one device.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os

import tensorflow as tf
from absl import logging

from tpurun import run_config as run_config_lib
from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig


@dataclasses.dataclass(frozen=True)
class Cluster:
    strategy: tf.distribute.Strategy
    description: str
    is_tpu: bool = False

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def check_batch_sizes(self, run: RunConfig) -> None:
        """Every global batch must split evenly across the replicas actually found."""
        for flag, size in (
            ("--batch_size", run.train_batch_size),
            ("--eval_batch_size", run.eval_batch_size),
            ("--predict_batch_size", run.predict_batch_size),
        ):
            run_config_lib.check_divisible(flag, size, self.num_replicas)


def tpu_vm_detected() -> bool:
    """True on a Cloud TPU VM: TPU chips are attached and libtpu is installed."""
    has_chips = bool(glob.glob("/dev/accel*")) or os.path.exists("/dev/vfio/0")
    return has_chips and importlib.util.find_spec("libtpu") is not None


def build(run: RunConfig) -> Cluster:
    """Builds the strategy for `run`. Must be called before TensorFlow runs any op."""
    wants_tpu = run.use_tpu is True or (run.use_tpu is None and (run.tpu or tpu_vm_detected()))
    if wants_tpu:
        from tpurun import tpu

        return tpu.connect(run)
    if run.use_tpu is None:
        logging.info(
            "No TPU configured (--tpu and TPU_NAME unset, not a TPU VM): running locally."
        )
    cluster = _local(run.num_shards)
    logging.info("Running on %s.", cluster.description)
    return cluster


def _local(num_shards: int | None) -> Cluster:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        count = num_shards or len(gpus)
        if count > len(gpus):
            raise UsageError(
                f"--num_shards={count} but this machine has {len(gpus)} GPU(s); "
                f"use --num_shards<={len(gpus)}"
            )
        if count == 1:
            return Cluster(tf.distribute.OneDeviceStrategy("/gpu:0"), "1 GPU")
        devices = [f"/gpu:{i}" for i in range(count)]
        return Cluster(
            tf.distribute.MirroredStrategy(devices), f"{count} GPUs (MirroredStrategy)"
        )
    count = num_shards or 1
    if count == 1:
        return Cluster(tf.distribute.get_strategy(), "1 CPU replica (default strategy)")
    _split_cpu(count)
    devices = [f"/cpu:{i}" for i in range(count)]
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    return Cluster(strategy, f"{count} logical CPU replicas (MirroredStrategy)")


def _split_cpu(count: int) -> None:
    """Splits the CPU into `count` logical devices, one per replica."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        # TensorFlow is already initialised (a second run in one process): the split
        # that exists must be large enough.
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing < count:
            raise RunError(
                f"--num_shards={count} needs {count} logical CPU devices but TensorFlow was "
                f"already initialised with {existing} in this process; run tpurun in a new process"
            ) from None
