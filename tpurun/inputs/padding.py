"""Static batches: a training batch checked, and eval and predict batches made static.

The last partial batch is padded (by repeating real rows, so no model sees zeros it
might take a log of), a 0/1 mask marks the real rows, and whole padding batches are
added so every replica gets a batch on every step.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpurun.errors import RunError


def check_static_batch(dataset: tf.data.Dataset, batch_size: int, model_name: str) -> None:
    for spec in tf.nest.flatten(dataset.element_spec):
        if spec.shape.rank is None or spec.shape.rank == 0 or spec.shape[0] != batch_size:
            raise RunError(
                f"{model_name}.input_fn(train) yields batches of shape {spec.shape}; a TPU needs "
                f"the static per-replica batch {batch_size}: batch with "
                "dataset.batch(params.batch_size, drop_remainder=True)"
            )


def pad_batches(dataset: tf.data.Dataset, batch_size: int, replicas: int) -> tf.data.Dataset:
    """Pads every batch to `batch_size` rows and appends a mask; groups batches by replica.

    A batch of more rows is refused (padding would cut it): when its static size says
    so, here; else as the batch is read.
    """
    fix = "batch it with params.batch_size (the per-replica batch), not params.global_batch_size"
    leaves = tf.nest.flatten(dataset.element_spec)
    for spec in leaves:
        if spec.shape.rank and spec.shape[0] is not None and spec.shape[0] > batch_size:
            raise RunError(
                f"the input yields batches of {spec.shape[0]} rows, more than the {batch_size} "
                f"of a replica: {fix}"
            )
    static_rows = leaves[0].shape[0] if leaves[0].shape.rank else None  # what pad_one reads
    # As the batch is read (no static size): the text of TensorFlow's error. Not asked of
    # every batch when the static size says it fits.
    too_large = (
        f"the input yields a batch of {{}} rows, more than the {batch_size} of a replica: {fix}"
    )

    def pad_one(*element: Any) -> tuple[Any, ...]:
        real = tf.shape(tf.nest.flatten(element)[0])[0]
        checks = []
        if static_rows is None:
            checks = [tf.debugging.Assert(real <= batch_size, [tf.strings.format(too_large, real)])]
        with tf.control_dependencies(checks):
            rows, mask = _padding(real, batch_size)
        padded = tf.nest.map_structure(lambda t: _take_rows(t, rows, batch_size), element)
        return (*padded, mask)

    dataset = dataset.map(pad_one, num_parallel_calls=tf.data.AUTOTUNE)
    if replicas > 1:
        # Steps consume `replicas` batches at once; the last step may find fewer, so
        # top it up with copies of a real batch whose mask is all zeros.
        def pad_group(*group: Any) -> tuple[Any, ...]:
            *tensors, mask = group
            rows, real_batches = _padding(tf.shape(mask)[0], replicas)
            padded = tf.nest.map_structure(lambda t: _take_rows(t, rows, replicas), tuple(tensors))
            return (*padded, _take_rows(mask, rows, replicas) * real_batches[:, None])

        dataset = dataset.batch(replicas).map(pad_group).unbatch()
    return dataset.prefetch(tf.data.AUTOTUNE)


def _padding(real: tf.Tensor, size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The rows that fill `real` rows up to `size` (0..real-1, then row 0 again), and the
    float32 mask of the real ones. Made once for every tensor of an element: a map's trace
    costs by its ops, and an eval or predict traces these maps at every pass."""
    positions = tf.range(size)
    is_real = positions < real
    return tf.where(is_real, positions, 0), tf.cast(is_real, tf.float32)


def _take_rows(tensor: tf.Tensor, rows: tf.Tensor, size: int) -> tf.Tensor:
    """`tensor`'s `rows` (from `_padding`), with the static size `size` in dimension 0."""
    padded = tf.gather(tensor, rows)
    padded.set_shape([size, *tensor.shape[1:]])
    return padded
