"""Breaks `xla-unsupported`: a tf.py_function and string ops inside the model."""

import tensorflow as tf
from fixture_base import TinyModel

from tpurun.model import register


@register("check_xla_unsupported")
class XlaUnsupported(TinyModel):
    def culprit(self, x):
        doubled = tf.py_function(lambda t: t * 2, [x], tf.float32)
        doubled.set_shape(x.shape)
        rounded = tf.strings.to_number(tf.strings.as_string(x, precision=2))
        return doubled + rounded
