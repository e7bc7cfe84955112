"""The paced model's data (paced_model.py), apart from its registration: tests use it alone."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def ids(count: int, batch: int = 1) -> tf.data.Dataset:
    """(ids [batch, 1], labels [batch]) elements: the ids 0..count-1 in order."""
    values = np.arange(count, dtype=np.float32).reshape(-1, batch, 1)
    return tf.data.Dataset.from_tensor_slices((values, (values[..., 0] % 3).astype(np.int32)))


def paced(dataset: tf.data.Dataset, milliseconds: int) -> tf.data.Dataset:
    """Each element waits `milliseconds` before it is given."""
    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=tf.constant(milliseconds * 1000, tf.int64),
        output_types=[spec.dtype for spec in tf.nest.flatten(dataset.element_spec)],
        output_shapes=[spec.shape for spec in tf.nest.flatten(dataset.element_spec)],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def with_python(dataset: tf.data.Dataset, kind: str) -> tf.data.Dataset:
    """`dataset` with a step of Python of `kind` ("": none); shapes kept, as a user sets them."""
    if kind in ("py_function", "numpy_function"):
        call = tf.py_function if kind == "py_function" else tf.numpy_function
        return dataset.map(
            lambda x, y: (tf.ensure_shape(call(lambda v: v, [x], tf.float32), x.shape), y)
        )
    if kind == "from_generator":
        generated = tf.data.Dataset.from_generator(
            lambda: iter(range(4)), output_signature=tf.TensorSpec([], tf.int64)
        )
        return tf.data.Dataset.zip(dataset, generated.repeat()).map(lambda pair, _: pair)
    return dataset
