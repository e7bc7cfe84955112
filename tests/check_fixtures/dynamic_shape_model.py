"""Breaks `dynamic-shape`: tf.boolean_mask keeps a data-dependent number of values."""

import tensorflow as tf
from fixture_base import TinyModel

from tpurun.model import register


@register("check_dynamic_shape")
class DynamicShape(TinyModel):
    def culprit(self, x):
        positive = tf.boolean_mask(x, x > 0)  # shape (None,): as many as are positive
        return x * tf.reduce_mean(positive)
