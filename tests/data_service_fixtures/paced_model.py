"""The tf.data service tests' model: features are the examples' ids, so a test can count them.

input_fn(TRAIN) yields batches of ids 0..examples-1 (as float32 features, id % 3 labels) in
order: its source's elements are whole batches, so that under distributed_epoch each of
them (a split) goes whole to one worker, once an epoch, and no worker is left with a
partial batch to drop. Each batch waits `pace_ms` on the worker that makes it (TensorFlow's
own SleepDataset op, public as tf.raw_ops); the epochs repeat `input_epochs` times (0:
endless), started at `params.start_batch` (a resumed run's, at an epoch's start under the
service: `input_fn_seeks`); with `python` set, a step of Python (which the service must
refuse).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tpurun.model import InputParams, Mode, Model, register


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


@register("service_paced")
class Paced(Model):
    input_fn_seeks = True

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        config = self.config
        if mode is not Mode.TRAIN:
            batched = ids(config.examples).unbatch().batch(params.batch_size)
            return batched.map(lambda x, y: x) if mode is Mode.PREDICT else batched
        dataset = with_python(ids(config.examples, params.batch_size), config.python)
        if config.pace_ms:
            dataset = paced(dataset, config.pace_ms)
        # Every epoch is the same: the position in one is all a start needs.
        first = params.start_batch % (config.examples // params.batch_size)
        return dataset.repeat(config.input_epochs or None).skip(first)

    def build(self) -> keras.Model:
        inputs = keras.Input(shape=(1,), name="id")
        return keras.Model(inputs, keras.layers.Dense(3, name="logits")(inputs), name="paced")

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)
