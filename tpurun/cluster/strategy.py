"""Where a run executes: the tf.distribute strategy for `--use_tpu/--tpu/--num_shards/TF_CONFIG`.

TPU when asked for (or configured/detected: `tpurun.cluster.tpu`); a GPU cluster when
TF_CONFIG names several workers (MultiWorkerMirroredStrategy); else local:
MirroredStrategy over GPUs or over logical CPU devices (so `--num_shards=8` on a
laptop has the 8 replicas of a v3-8), OneDeviceStrategy for one GPU, and
TensorFlow's default strategy for one CPU, which is about 2.5x faster per step
than MirroredStrategy over one device.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf
from absl import logging

from tpurun import tf_internals
from tpurun.cluster import packed_reduction, tpu
from tpurun.cluster.machines import Cluster, is_chief_task, tpu_vm_detected
from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig


def build(run: RunConfig) -> Cluster:
    """Builds the strategy for `run`. Must be called before TensorFlow runs any op."""
    wants_tpu = run.use_tpu is True or (run.use_tpu is None and (run.tpu or tpu_vm_detected()))
    if wants_tpu:
        return tpu.connect(run)
    multi_worker = _multi_worker(run.tpu_init_timeout)
    if multi_worker is not None:
        logging.info("Running on %s as %s.", multi_worker.description, multi_worker.task)
        return multi_worker
    if run.use_tpu is None:
        logging.info("No TPU configured (--tpu and TPU_NAME unset, not a TPU VM): running locally.")
    cluster = local(run.num_shards)
    logging.info("Running on %s.", cluster.description)
    return cluster


def local(num_shards: int | None) -> Cluster:
    """`num_shards` local GPUs, else that many logical CPU devices (default: 1 device)."""
    if not os.environ.get("TF_CONFIG", "-").strip():
        # Blank means no cluster, as unset does; MirroredStrategy reads TF_CONFIG too,
        # and fails to parse a blank one.
        del os.environ["TF_CONFIG"]
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
        return Cluster(tf.distribute.MirroredStrategy(devices), f"{count} GPUs (MirroredStrategy)")
    count = num_shards or 1
    if count == 1:
        return Cluster(tf.distribute.get_strategy(), "1 CPU replica (default strategy)")
    split_cpu(count)
    devices = [f"/cpu:{i}" for i in range(count)]
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=packed_reduction.cross_device_ops()
    )
    return Cluster(strategy, f"{count} logical CPU replicas (MirroredStrategy)")


def split_cpu(count: int) -> None:
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


def _multi_worker(start_timeout: float) -> Cluster | None:
    """MultiWorkerMirroredStrategy when TF_CONFIG describes several workers (a GPU cluster).

    Fails after `start_timeout` seconds if not every worker has joined.
    """
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return None
    try:
        tf_config = json.loads(raw)
        cluster_spec = tf_config.get("cluster", {})
        task_type, task_index = tf_config["task"]["type"], int(tf_config["task"]["index"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(
            "TF_CONFIG is not valid: it must be JSON like "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}'
        ) from None
    workers = len(cluster_spec.get("chief", [])) + len(cluster_spec.get("worker", []))
    if workers <= 1:
        return None
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    # TensorFlow alone waits forever for a worker that never joins (one whose chief
    # failed at start-up hung with it).
    why_not = tf_internals.bound_worker_registration(spec, start_timeout)
    if why_not:
        logging.warning(
            "Cannot bound the wait for the other workers (%s): waiting as long as it takes.",
            why_not,
        )
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    except tf.errors.DeadlineExceededError:
        addresses = ", ".join(
            spec.task_address(job, i) for job in spec.jobs for i in range(spec.num_tasks(job))
        )
        raise RunError(
            f"{task_type}-{task_index} waited {start_timeout:g}s for the other workers of "
            f"TF_CONFIG ({addresses}) and not all of them joined; start every worker with "
            "the same TF_CONFIG cluster (one that failed says why in its own log), or raise "
            "--tpu_init_timeout"
        ) from None
    description = (
        f"{workers} workers, {strategy.num_replicas_in_sync} replicas (MultiWorkerMirroredStrategy)"
    )
    return Cluster(
        strategy,
        description,
        is_chief=is_chief_task(cluster_spec, task_type, task_index),
        task=f"{task_type}-{task_index}",
        num_workers=workers,
    )
