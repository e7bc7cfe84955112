"""FLOPS: the "quick test, just to measure FLOPS" of the TPU Colab, as a tpurun model.

The Colab multiplied an N x N matrix by another one COUNT times in a row on every
TPU core and divided `cores * COUNT * 2 * N^3` by the wall-clock time. Here:

* `tpurun train` trains a chain of `config.flops.matmuls` products with one
  shared N x N weight (`x -> x W -> x W W -> ...`, learning W^K ~ I on random
  rows): a real replicated training step made of large matmuls. A replica's step
  is (6K - 2) * B * N^2 FLOP, B its batch: the K products forward, 2 * B * N^2
  each, and backward K products for W's gradient but only K - 1 for the
  activations' (the input x needs none); the first training log line says so
  (`tpurun check --target` finds the TPU compiler counts the same). The rows are
  one global batch of random numbers, the model's `train_arrays`, declared by
  their shape so that `tpurun check` sizes a batch this machine could not hold:
  they stay on the device, so the input costs nothing next to the matmuls.
* `tpurun predict` (the model's `generate`) is the measurement: on every replica
  it multiplies a random N x N matrix by the trained W (rescaled to keep the
  values bounded) K times per loop, for `config.flops.loops` loops inside one
  `tf.function` call, after a warm-up call that compiles it; for each dtype it
  prints achieved TFLOP/s per replica and in total, counting 2 * N^3 FLOP per
  product per replica over the wall-clock time of the timed call.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tpurun.errors import UsageError
from tpurun.model import InputParams, Mode, Model, TrainArrays, register

FEATURE = "x"
DTYPES = ("float32", "bfloat16")


class MatmulChain(keras.layers.Layer):
    """x -> x W^K: K products with one shared N x N weight."""

    def __init__(self, n: int, matmuls: int, **kwargs):
        super().__init__(**kwargs)
        self.n, self.matmuls = n, matmuls

    def build(self, input_shape):
        # Entries of variance 1/N keep |x W| ~ |x|: the chain neither overflows nor
        # sinks into (slow) denormals.
        self.kernel = self.add_weight(
            shape=(self.n, self.n),
            initializer=keras.initializers.RandomNormal(stddev=self.n**-0.5),
            name="kernel",
        )

    def call(self, x):
        for _ in range(self.matmuls):
            x = keras.ops.matmul(x, self.kernel)
        return x


def train_step_flops(matmuls: int, batch: int, n: int) -> int:
    """FLOP of one replica's training step: (6K - 2) * B * N^2.

    Forward, K products [B x N] x [N x N] of 2 * B * N^2 each. Backward, W's
    gradient takes one product per use of W (K), and the activations' gradient one
    per product but the first: the input x needs no gradient (K - 1).
    """
    return (6 * matmuls - 2) * batch * n * n


def dtypes_of(setting: str) -> tuple[str, ...]:
    if setting == "both":
        return DTYPES
    if setting not in DTYPES:
        raise UsageError(f"config.flops.dtype={setting!r}: use float32, bfloat16 or both")
    return (setting,)


@register("flops")
class Flops(Model):
    """A chain of N x N matmuls; `tpurun predict` measures their TFLOP/s on every replica."""

    # Eval reads the one fixed batch of random rows it trains on: how well the chain
    # fits it, no held-out data.
    eval_splits = ("train",)

    def _rows(self, rows: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.standard_normal((rows, self.config.flops.n), dtype=np.float32)

    def train_arrays(self) -> TrainArrays:
        batch = self.config.train.batch_size

        def inputs_as_targets(arrays, rows):  # W^K should become I
            x = tf.gather(arrays[FEATURE], rows)
            return {FEATURE: x}, x

        # One global batch of random rows, each epoch a new order of them; declared,
        # made only when training needs them (N=16384 at batch 2^20 is 64 GiB).
        return TrainArrays.declare(
            {FEATURE: tf.TensorSpec([batch, self.config.flops.n], tf.float32)},
            build=lambda: {FEATURE: self._rows(batch, self.config.seed)},
            count=batch,
            batch=inputs_as_targets,
        )

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        """EVAL and PREDICT (TRAIN comes from train_arrays): one fixed batch of random rows."""
        x = self._rows(params.batch_size, params.seed + params.input_pipeline_id)
        if mode is Mode.PREDICT:
            return tf.data.Dataset.from_tensors({FEATURE: x})
        dataset = tf.data.Dataset.from_tensors(({FEATURE: x}, x))
        return dataset.repeat(self.config.flops.eval_batches)

    def build(self) -> keras.Model:
        flops = self.config.flops
        dtypes_of(flops.dtype)  # fail before training, not after
        # Built in the strategy's scope: the replicas --batch_size is split over.
        per_replica = (
            self.config.train.batch_size // tf.distribute.get_strategy().num_replicas_in_sync
        )
        logging.info(
            "flops: a training step is %.1f GFLOP per replica ((6 x %d - 2) x %d x %d^2: %d "
            "matmuls of [%d x %d] x [%d x %d] forward, %d backward).",
            train_step_flops(flops.matmuls, per_replica, flops.n) / 1e9,
            flops.matmuls,
            per_replica,
            flops.n,
            flops.matmuls,
            per_replica,
            flops.n,
            flops.n,
            flops.n,
            2 * flops.matmuls - 1,
        )
        inputs = {FEATURE: keras.Input(shape=(flops.n,), dtype="float32", name=FEATURE)}
        chain = MatmulChain(flops.n, flops.matmuls, name="matmuls")
        return keras.Model(inputs=inputs, outputs=chain(inputs[FEATURE]), name="flops")

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(tf.square(outputs - labels), axis=-1)

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"norm": tf.norm(outputs, axis=-1)}

    def generate(
        self, keras_model: keras.Model, strategy: tf.distribute.Strategy
    ) -> list[dict[str, Any]]:
        flops = self.config.flops
        kernel = keras_model.get_layer("matmuls").kernel
        rows = []
        for dtype in dtypes_of(flops.dtype):
            seconds = measure(
                strategy, kernel, dtype, flops.n, flops.matmuls, flops.loops, self.config.seed
            )
            replicas = strategy.num_replicas_in_sync
            per_replica = flops.loops * flops.matmuls * 2 * flops.n**3 / seconds / 1e12
            rows.append(
                {
                    "dtype": dtype,
                    "tflops_per_replica": per_replica,
                    "tflops_total": per_replica * replicas,
                    "replicas": replicas,
                    "n": flops.n,
                    "matmuls": flops.loops * flops.matmuls,
                    "seconds": seconds,
                }
            )
        return rows

    def format_predictions(self, rows: list[dict[str, Any]]) -> list[str]:
        return [
            f"{row['dtype']}: {row['tflops_per_replica']:.4g} TFLOP/s per replica, "
            f"{row['tflops_total']:.4g} TFLOP/s total ({row['replicas']} replica(s), "
            f"{row['matmuls']} matmuls of {row['n']}x{row['n']} each in {row['seconds']:.4g} s)"
            for row in rows
        ]


def measure(
    strategy: tf.distribute.Strategy,
    kernel: Any,
    dtype: str,
    n: int,
    matmuls: int,
    loops: int,
    seed: int,
) -> float:
    """Seconds for `loops` x `matmuls` chained N x N products on every replica, after warm-up."""

    def replica_fn(num_loops):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        x = tf.random.stateless_normal([n, n], seed=tf.stack([seed, replica]))
        w = tf.convert_to_tensor(kernel)
        # Rescaled to Frobenius norm sqrt(N), the norm it starts training with.
        w = w * (n**0.5 / tf.norm(w))
        x, w = tf.cast(x, dtype), tf.cast(w, dtype)

        def body(i, x):
            for _ in range(matmuls):
                x = tf.matmul(x, w)
            return i + 1, x

        _, x = tf.while_loop(lambda i, _: i < num_loops, body, [tf.constant(0), x])
        return tf.reduce_sum(tf.cast(x, tf.float32))

    @tf.function
    def run(num_loops):
        per_replica = strategy.run(replica_fn, args=(num_loops,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    float(run(tf.constant(1)))  # compiles and warms up
    start = time.perf_counter()
    float(run(tf.constant(loops)))  # float(): waits for every replica to finish
    return time.perf_counter() - start
