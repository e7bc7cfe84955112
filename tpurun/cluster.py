"""Where a run executes: the tf.distribute strategy and a one-line description of it.

TPU when asked for (or configured/detected), else local: MirroredStrategy over
GPUs or over logical CPU devices (so `--num_shards=8` on a laptop has the 8
replicas of a v3-8), and the default strategy for a single device, which is
about 2.5x faster per step than MirroredStrategy over one device.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import importlib.util
import json
import os
from typing import Any

import tensorflow as tf
from absl import logging

# Only for PackedReductionToOneDevice: tf.distribute has no public constructor for
# the PerReplica and Mirrored values a CrossDeviceOps takes and returns.
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import values as values_lib

from tpurun import run_config as run_config_lib
from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig


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


def replica_sum(strategy: tf.distribute.Strategy, values: tf.Tensor) -> tf.Tensor:
    """`values` of every replica of every worker, added up (each worker passes its own).

    Call it inside a tf.function. Under MultiWorkerMirroredStrategy it is also a
    barrier: it returns once every worker has called it.
    """
    per_replica = strategy.run(lambda: tf.identity(values))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


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
    multi_worker = _multi_worker(run.tpu_init_timeout)
    if multi_worker is not None:
        logging.info("Running on %s as %s.", multi_worker.description, multi_worker.task)
        return multi_worker
    if run.use_tpu is None:
        logging.info("No TPU configured (--tpu and TPU_NAME unset, not a TPU VM): running locally.")
    cluster = _local(run.num_shards)
    logging.info("Running on %s.", cluster.description)
    return cluster


def _is_chief(cluster_spec: dict, task_type: str, task_index: int) -> bool:
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
        return _is_chief(tf_config.get("cluster", {}), task["type"], int(task["index"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return True  # no (valid) TF_CONFIG: a single process, or _multi_worker's error


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
    is_chief = _is_chief(cluster_spec, task_type, task_index)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    _bound_cluster_start(spec, start_timeout)
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
        is_chief=is_chief,
        task=f"{task_type}-{task_index}",
        num_workers=workers,
    )


def _bound_cluster_start(cluster_spec: tf.train.ClusterSpec, timeout: float) -> None:
    """Makes a worker fail after `timeout` seconds when the others never join.

    By default TensorFlow waits for them forever: a worker whose chief failed at
    start-up hung with it. MultiWorkerMirroredStrategy sets up the coordination
    service only when none is configured yet, so this configures the same one (its
    leader and jobs) with a registration deadline. Private API (no public setting
    exists); if it moves, the worker just waits as TensorFlow does by default.
    """
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context

        jobs = [
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in cluster_spec.jobs
        ]
        context.context().configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(cluster_spec),
            coordinated_jobs=jobs,
            cluster_register_timeout_in_ms=int(timeout * 1000),
        )
        # Every task, the leader too, waits at registration for all the others (with
        # the deadline above); without it the chief registers alone and then waits in
        # its first collective, with no deadline.
        context.context().coordination_service.cluster_register_with_barrier = True
    except (ImportError, AttributeError, TypeError) as e:
        logging.warning(
            "Cannot bound the wait for the other workers (%s): waiting as long as it takes.", e
        )


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
        return Cluster(tf.distribute.MirroredStrategy(devices), f"{count} GPUs (MirroredStrategy)")
    count = num_shards or 1
    if count == 1:
        return Cluster(tf.distribute.get_strategy(), "1 CPU replica (default strategy)")
    _split_cpu(count)
    devices = [f"/cpu:{i}" for i in range(count)]
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=PackedReductionToOneDevice()
    )
    return Cluster(strategy, f"{count} logical CPU replicas (MirroredStrategy)")


class PackedReductionToOneDevice(tf.distribute.ReductionToOneDevice):
    """ReductionToOneDevice that all-reduces a batch of dense tensors as one tensor per dtype.

    Keras's optimizer all-reduces all the gradients of a step in one batch.
    ReductionToOneDevice reduces them one at a time: per variable, a fan-in of
    every replica's gradient to one device and a fan-out of the sum back, i.e.
    2 x replicas cross-device copies, each costing the executor a few
    microseconds whatever the size. Here each replica's gradients are first
    concatenated into one flat tensor (per dtype), so a step pays that fan-in and
    fan-out once; the sum is the same add_n, bit for bit. With Iris on 8 logical
    CPUs this cut the all-reduce from ~400 to ~150 us per step.

    Not HierarchicalCopyAllReduce(num_packs=1), which also packs: it splits the
    devices into two equal halves (a DGX-1 layout), so with an odd count it
    silently leaves one replica out of the sum, and it cannot pack mixed dtypes.
    """

    def batch_reduce_implementation(
        self, reduce_op: tf.distribute.ReduceOp, value_destination_pairs: Any, options: Any
    ) -> list[Any]:
        pairs = list(value_destination_pairs)
        # dtype -> indices of the values packed together; None: reduced one by one.
        groups: dict[tf.DType | None, list[int]] = collections.defaultdict(list)
        for i, (value, destinations) in enumerate(pairs):
            groups[value.values[0].dtype if _packable(value, destinations) else None].append(i)
        results: list[Any] = [None] * len(pairs)
        for dtype, indices in groups.items():
            if dtype is None or len(indices) == 1:
                for i in indices:
                    results[i] = self.reduce_implementation(reduce_op, *pairs[i], options)
                continue
            reduced = self._reduce_packed(reduce_op, [pairs[i][0] for i in indices], options)
            for i, value in zip(indices, reduced, strict=True):
                results[i] = value
        return results

    def _reduce_packed(
        self, reduce_op: tf.distribute.ReduceOp, per_replica_values: list[Any], options: Any
    ) -> list[Any]:
        """All-reduces same-dtype PerReplica values as one; returns one Mirrored per value."""
        shapes = [value.values[0].shape for value in per_replica_values]
        sizes = [shape.num_elements() for shape in shapes]
        packed = []
        for parts in zip(*(value.values for value in per_replica_values), strict=True):
            with tf.device(parts[0].device):
                packed.append(tf.concat([tf.reshape(part, [-1]) for part in parts], axis=0))
        packed_value = values_lib.PerReplica(packed)
        summed = self.reduce_implementation(reduce_op, packed_value, packed_value, options)
        unpacked = []  # [replica][value]
        for flat in summed.values:
            with tf.device(flat.device):
                pieces = tf.split(flat, sizes)
                unpacked.append([tf.reshape(p, s) for p, s in zip(pieces, shapes, strict=True)])
        return [
            distribute_utils.regroup(
                [replica[k] for replica in unpacked], wrap_class=values_lib.Mirrored
            )
            for k in range(len(per_replica_values))
        ]


def _packable(value: Any, destinations: Any) -> bool:
    """An all-reduce (destinations = the value's own devices) of dense tensors of one static shape."""
    if not isinstance(value, values_lib.PerReplica) or destinations is not value:
        return False
    parts = value.values
    return all(
        isinstance(part, tf.Tensor)
        and part.shape.is_fully_defined()
        and part.shape == parts[0].shape
        and part.dtype == parts[0].dtype
        for part in parts
    )


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
