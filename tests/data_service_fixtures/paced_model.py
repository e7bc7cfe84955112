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
import tensorflow as tf
from paced_data import ids, paced, with_python

from tpurun.model import InputParams, Mode, Model, register


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
