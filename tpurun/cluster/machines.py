"""What a run executes on: `Cluster` (the strategy, its replicas, workers and chief), and facts
about this machine (a Cloud TPU VM) and its TF_CONFIG (which task is the chief)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import tensorflow as tf

from tpurun.run_config import RunConfig, check_divisible
from tpurun.tpu_vm.devices import tpu_device_files


@dataclasses.dataclass(frozen=True)
class Cluster:
    strategy: tf.distribute.Strategy
    description: str
    is_tpu: bool = False
    # Multi-worker runs: only the chief writes checkpoints, summaries and records;
    # the other workers write their part of each checkpoint to a scratch dir.
    is_chief: bool = True
    task: str = "chief"  # "<type>-<index>" in a TF_CONFIG cluster
    num_workers: int = 1
    # What a stand-in cluster stands for (`tpurun check` traces a TPU slice on CPU
    # devices): the hosts feeding the replicas and the device kind ("TPU", "GPU",
    # "CPU"); 0 and "" when the strategy's own devices say.
    hosts: int = 0
    device_kind: str = ""

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def replica_kind(self) -> str:
        """TPU, GPU or CPU: what the replicas run on, or for a stand-in what it stands for."""
        return self.device_kind or device_kind(self.strategy)

    def check_batch_sizes(self, run: RunConfig) -> None:
        """Every global batch must split evenly across the replicas actually found."""
        for flag, size in (
            ("--batch_size", run.train_batch_size),
            ("--eval_batch_size", run.eval_batch_size),
            ("--predict_batch_size", run.predict_batch_size),
        ):
            check_divisible(flag, size, self.num_replicas)


def device_kind(strategy: tf.distribute.Strategy) -> str:
    """CPU, GPU or TPU: what the replicas run on."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy, which tpurun uses for one CPU replica only
        return "CPU"
    return tf.DeviceSpec.from_string(devices[0]).device_type or "CPU"


def replica_sum(strategy: tf.distribute.Strategy, values: tf.Tensor) -> tf.Tensor:
    """`values` of every replica of every worker, added up (each worker passes its own).

    Call it inside a tf.function. Under MultiWorkerMirroredStrategy it is also a
    barrier: it returns once every worker has called it.
    """
    per_replica = strategy.run(lambda: tf.identity(values))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


def tpu_vm_detected() -> bool:
    """True on a Cloud TPU VM: TPU chips are attached and libtpu is installed."""
    return bool(tpu_device_files()) and importlib.util.find_spec("libtpu") is not None


def is_chief_task(cluster_spec: dict, task_type: str, task_index: int) -> bool:
    """The chief is the "chief" task, or worker 0 when the cluster names no chief."""
    return task_type == "chief" or (
        task_type == "worker" and task_index == 0 and not cluster_spec.get("chief")
    )


def is_chief_process() -> bool:
    """False only for a non-chief task of a TF_CONFIG cluster; read before any strategy exists.

    Such a worker shares model_dir with the chief, so it must never clean it up.
    """
    try:
        tf_config = json.loads(os.environ.get("TF_CONFIG", "") or "{}")
        task = tf_config.get("task", {})
        return is_chief_task(tf_config.get("cluster", {}), task["type"], int(task["index"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return True  # no (valid) TF_CONFIG: a single process, or the strategy's error
