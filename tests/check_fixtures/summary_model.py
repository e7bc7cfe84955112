"""Breaks `summary`: tf.summary inside the layer's call, i.e. inside the TPU step."""

import tensorflow as tf
from fixture_base import TinyModel

from tpurun.model import register


@register("check_summary")
class Summary(TinyModel):
    def culprit(self, x):
        tf.summary.histogram("activations", x)
        return x
