"""Device data: in-memory training examples kept in every replica's memory, batches gathered in the step.

For a model with `train_arrays` (tpurun.model.TrainArrays), the arrays are placed
once in each replica's memory - a TPU core's HBM, a GPU's memory, the host's
memory for CPU replicas - as non-trainable variables outside any checkpoint, and
each replica step computes its own batch from (seed, step): no infeed, no
tf.data hand-over, nothing to wait for. The batches are those tf.data would have
given (`tpurun.inputs.seekable_batches`; one scheme, `tpurun.inputs.example_order`): on
step s, replica r of R takes element s*R + r of its input pipeline's stream, as
the distributed dataset deals them, and with gradient accumulation that element
is `micro_batches` consecutive batches.

It applies to one input pipeline (one host): a multi-worker cluster or a
multi-host TPU slice keeps tf.data. Above a memory budget per device
(`config.train.device_data_mb`; automatic: CPU_BUDGET_MB on CPU replicas,
ACCELERATOR_BUDGET_MB on a TPU core or GPU) the arrays stay in tf.data too, and
`config.train.device_data=false` turns it off; each says so in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from tpurun.cluster import Cluster
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import TrainArrays

# Automatic budgets per device. CPU replicas hold the arrays in host memory (under
# MirroredStrategy one copy per logical device); accelerators get a quarter of the
# smallest memory tpurun targets, a TPU v2 core's 8 GiB, since TensorFlow has no
# public API for a device's total memory.
CPU_BUDGET_MB = 256
ACCELERATOR_BUDGET_MB = 2048


class DeviceData:
    """The training arrays (and their order's table) in every replica's memory.

    `values` is what the host loop passes to each replica step; `replica_batch`
    turns it and the step number into that replica's batch. Both are public so that
    `tpurun check` traces the very step that trains.
    """

    def __init__(
        self,
        arrays: TrainArrays,
        order: ExampleOrder,
        replicas: int,
        global_batch: int,
        micro_batches: int,
    ):
        self.examples = arrays
        self.order = order
        self.replicas = replicas
        self.batch_size = global_batch // replicas
        self.micro_batches = micro_batches
        self.values: Any = None  # from place()

    def _host_values(self) -> dict[str, Any]:
        values = {"arrays": tf.nest.map_structure(np.asarray, self.examples.arrays)}
        if self.order.table is not None:
            values["table"] = self.order.table
        return values

    def place(self, strategy: tf.distribute.Strategy) -> None:
        """Puts the arrays (and the table) in every replica's memory, as `values`."""
        with strategy.scope():
            # Variables, not captured tensors: a TPU keeps a variable in every core's
            # HBM, where a tensor argument would be fed to the TPU on every step.
            self.values = tf.nest.map_structure(
                lambda a: tf.Variable(a, trainable=False, name="device_data"), self._host_values()
            )

    def spec(self) -> Any:
        """`values` as TensorSpecs, without placing or building anything: what `tpurun
        check` traces (from the arrays' specs: declared arrays stay unbuilt)."""
        spec = {"arrays": self.examples.specs}
        if self.order.table is not None:
            table = self.order.table
            spec["table"] = tf.TensorSpec(table.shape, tf.as_dtype(table.dtype))
        return spec

    def replica_batch(self, step: tf.Tensor, values: Any) -> Any:
        """This replica's `(features, labels)` for `step` (int64), from `values`.

        [micro_batches, batch, ...] with gradient accumulation, else [batch, ...].
        """
        # Read once: XLA has no kernel for gathers from a variable by n-d indices.
        values = tf.nest.map_structure(tf.convert_to_tensor, values)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        first = (tf.cast(step, tf.int64) * self.replicas + tf.cast(replica, tf.int64)) * (
            self.micro_batches
        )
        # compiled: the cipher in plain ops, which XLA compiles (on a TPU it must).
        rows = self.order.batch_rows(
            first, self.micro_batches, self.batch_size, table=values.get("table"), compiled=True
        )
        if self.micro_batches == 1:
            rows = rows[0]
        return self.examples.examples(values["arrays"], rows)


def nbytes(arrays: TrainArrays, order: ExampleOrder) -> int:
    """What one replica holds: the arrays and the order's table."""
    sizes = [spec.shape.num_elements() * spec.dtype.size for spec in tf.nest.flatten(arrays.specs)]
    return sum(sizes) + (0 if order.table is None else order.table.nbytes)


def budget_mb(configured: float, kind: str) -> float:
    """The budget per device: the configured one, or the automatic one for its `kind`."""
    if configured:
        return configured
    return CPU_BUDGET_MB if kind == "CPU" else ACCELERATOR_BUDGET_MB


def hosts(strategy: tf.distribute.Strategy) -> int:
    """Hosts (tasks) whose devices hold replicas of `strategy` on this worker."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:
        return 1
    return len({(spec.job, spec.task) for spec in map(tf.DeviceSpec.from_string, devices)})


SEVERAL_HOSTS = "it runs on one host, and this cluster feeds its replicas from several"


def why_not(
    arrays: TrainArrays, order: ExampleOrder, cluster: Cluster, configured_mb: float
) -> str:
    """Why device data does not apply on `cluster` ("" when it does)."""
    if cluster.num_workers > 1 or (cluster.hosts or hosts(cluster.strategy)) > 1:
        return SEVERAL_HOSTS
    kind = cluster.replica_kind
    size, budget = nbytes(arrays, order), budget_mb(configured_mb, kind)
    if size > budget * 2**20:
        setting = f"={configured_mb:g}" if configured_mb else f" (automatic: {budget:g} MB)"
        return (
            f"the arrays take {size / 2**20:.1f} MB per replica, more than "
            f"config.train.device_data_mb{setting}; raise it if the device has the memory"
        )
    return ""


def describe(arrays: TrainArrays, order: ExampleOrder) -> str:
    """'120 examples, 2.3 kB + a 120 kB order table per replica' for the log."""
    table = "" if order.table is None else f" + a {_size(order.table.nbytes)} order table"
    data = _size(nbytes(arrays, order) - (0 if order.table is None else order.table.nbytes))
    return f"{arrays.num_examples} examples, {data}{table} per replica"


def _size(count: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def log_fallback(reason: str) -> None:
    logging.info("Training data stays in tf.data, not on the device: %s.", reason)
