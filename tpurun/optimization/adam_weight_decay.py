"""AdamWeightDecay: google-research/bert's optimizer (optimization.py), as a Keras optimizer.

Adam without bias correction, its epsilon outside the square root, with decoupled
weight decay: every step

    m = beta_1 x m + (1 - beta_1) x g
    v = beta_2 x v + (1 - beta_2) x g^2
    w = w - rate x (m / (sqrt(v) + epsilon) + weight_decay x w)

(`weight_decay x w` only for the variables not excluded). Keras' Adam and AdamW scale
the step by sqrt(1 - beta_2^t) / (1 - beta_1^t), which in the first thousand steps is
far from 1: a BERT checkpoint fine-tuned with them takes other steps than it did
under TPUEstimator. The decay is Keras' own (`weight_decay`, applied as w - rate x
weight_decay x w before the update, with tpurun's regex exclusions): the same
arithmetic as optimization.py's, in another order of the two subtractions.

Its slots are `momentum` and `velocity` (Keras' Adam's), optimization.py's `adam_m` and
`adam_v`. Selected by `config.optimizer.name = "adamweightdecay"`.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tpurun")
class AdamWeightDecay(keras.optimizers.Adam):
    """keras.optimizers.Adam without bias correction (optimization.py's AdamWeightDecayOptimizer).

    Takes Adam's arguments (epsilon 1e-6 by default, optimization.py's); `amsgrad` is not
    optimization.py's and is refused.
    """

    def __init__(
        self,
        learning_rate: Any = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        weight_decay: float | None = None,
        name: str | None = None,
        **kwargs: Any,
    ):
        if kwargs.get("amsgrad"):
            raise ValueError("AdamWeightDecay has no amsgrad (optimization.py's has none)")
        super().__init__(
            learning_rate=learning_rate,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            weight_decay=weight_decay,
            name=name,
            **kwargs,
        )

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        dtype = variable.dtype
        rate = tf.cast(learning_rate, dtype)
        # An embedding's gradient arrives as IndexedSlices: every row of m and v decays
        # each step (optimization.py's dense update), so it is made dense.
        gradient = tf.cast(tf.convert_to_tensor(gradient), dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        next_m = beta_1 * m + (1.0 - beta_1) * gradient
        next_v = beta_2 * v + (1.0 - beta_2) * tf.square(gradient)
        self.assign(m, next_m)
        self.assign(v, next_v)
        self.assign_sub(variable, rate * (next_m / (tf.sqrt(next_v) + self.epsilon)))
