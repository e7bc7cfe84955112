"""The all-reduce of replicas on logical CPU devices, packed into one tensor per dtype."""

from __future__ import annotations

import collections
from typing import Any

import tensorflow as tf

from tpurun import tf_internals


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
    Building the packed values needs private TensorFlow API (`tpurun.tf_internals`);
    without it, `cross_device_ops()` gives the stock reduction.
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
        packed_value = tf_internals.per_replica(packed)
        summed = self.reduce_implementation(reduce_op, packed_value, packed_value, options)
        unpacked = []  # [replica][value]
        for flat in summed.values:
            with tf.device(flat.device):
                pieces = tf.split(flat, sizes)
                unpacked.append([tf.reshape(p, s) for p, s in zip(pieces, shapes, strict=True)])
        return [
            tf_internals.mirrored([replica[k] for replica in unpacked])
            for k in range(len(per_replica_values))
        ]


def cross_device_ops() -> tf.distribute.CrossDeviceOps:
    """The packed reduction, or TensorFlow's stock one when the private API it needs moved."""
    if tf_internals.distributed_values_available():
        return PackedReductionToOneDevice()
    return tf.distribute.ReductionToOneDevice()


def _packable(value: Any, destinations: Any) -> bool:
    """An all-reduce (destinations = the value's own devices) of dense tensors of one static shape."""
    if not tf_internals.is_per_replica(value) or destinations is not value:
        return False
    parts = value.values
    return all(
        isinstance(part, tf.Tensor)
        and part.shape.is_fully_defined()
        and part.shape == parts[0].shape
        and part.dtype == parts[0].dtype
        for part in parts
    )
