"""config.precision: the Keras mixed-precision policy a run builds its model under.

`float32` (default), `mixed_bfloat16` (a TPU's native matmul type; about 2x faster
on CPUs with AVX512_BF16 too) or `mixed_float16` (GPUs; with dynamic loss scaling).
Under a mixed policy layers compute in 16 bits but keep float32 variables, so a
checkpoint is the same whatever the precision it was trained in: a run trained in
bfloat16 evaluates, predicts, resumes and exports under any precision. What the
launcher computes from the model's outputs (the loss, the metrics, the
predictions, the exported signature's outputs) is computed in float32: `float32`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf


@contextlib.contextmanager
def policy(name: str) -> Iterator[None]:
    """Builds every Keras layer made within the block under the `name` policy.

    Keras keeps the policy in global state; the previous one is back afterwards, so
    a run in a process (tests call the CLI in-process) does not leak it to the next.
    """
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


# do_not_convert: autograph leaves the function as written (it has no tensor-dependent
# Python control flow and calls no user code); autograph's conversions cost a process
# ~0.1 CPU-s a function at its first trace: a third of its first Iris training's CPU.
@tf.autograph.experimental.do_not_convert
def float32(outputs: Any) -> Any:
    """The model's outputs with every 16-bit float tensor cast to float32."""

    def cast(tensor: Any) -> Any:
        if isinstance(tensor, tf.Tensor) and tensor.dtype in (tf.bfloat16, tf.float16):
            return tf.cast(tensor, tf.float32)
        return tensor

    return tf.nest.map_structure(cast, outputs)


def needs_loss_scaling(name: str) -> bool:
    """float16's narrow exponent underflows small gradients; bfloat16's does not."""
    return name == "mixed_float16"
