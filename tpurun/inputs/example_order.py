"""The order of in-memory training examples: which examples batch k of a training stream holds.

One scheme, used by both ways in-memory examples reach a step (`tpurun.inputs.
seekable_batches` in tf.data, and `tpurun.inputs.device_data` inside the compiled step):

* batch k of input pipeline p (of P) holds the positions [k*B, (k+1)*B) of its
  shard of an endless stream of examples; position i of the shard is position
  i*P + p of the stream all pipelines share (`batch_positions`);
* stream position n is the example `index_shuffle(n % count)` of epoch n // count:
  every epoch is a new permutation of all `count` examples, keyed by (seed, epoch).

The permutation is TensorFlow's `tf.random.experimental.index_shuffle` (the
RandomIndexShuffle op, 4 rounds, key [seed, epoch, 0]): a Simon block cipher on
blocks of B bits (at least 16) that re-encrypts a value until it falls in
[0, count). `count` near 2^B needs about one encryption per example, a small
dataset about 2^16 / count (546 for Iris's 120 rows). So:

* small datasets table every epoch's permutation once, with the op: the cipher's
  key words are truncated to B/2 bits, so with 16-bit blocks epoch e and e + 256
  are the same permutation, and all of them fit in a [256, count] table (~0.2 s
  of CPU, whatever the count); an example then costs one gather;
* larger ones encrypt each example where its batch is made: with the op in tf.data,
  and in the training step with `index_shuffle`, the same cipher written again in
  plain integer ops, bit for bit, because the op has no XLA kernel and a TPU's step
  (or tpurun's compiled host loop) is compiled by XLA. tests/test_example_order.py
  holds the two to the same bits.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import tensorflow as tf

ROUNDS = 4  # tf.random.experimental.index_shuffle's default, as seekable_batches used it
# Above this many encryptions per example on average, the epochs' permutations are
# tabled (at most 256 x 8191 int32 = 8 MB); below, each example is encrypted in the step.
TABLE_ABOVE_ENCRYPTIONS = 8


def block_bits(count: int) -> int:
    """The cipher's block size for `count` examples, as the RandomIndexShuffle kernel picks it."""
    max_index = count - 1
    bits = math.ceil(math.log2(max_index)) if max_index > 1 else 0
    return max(bits + bits % 2, 16)


def _rotate_left(x: tf.Tensor, r: int, word: int) -> tf.Tensor:
    mask = tf.constant((1 << word) - 1, x.dtype)
    left = tf.bitwise.left_shift(x, tf.constant(r, x.dtype))
    right = tf.bitwise.right_shift(x, tf.constant(word - r, x.dtype))
    return tf.bitwise.bitwise_and(tf.bitwise.bitwise_or(left, right), mask)


def _rotate_right(x: tf.Tensor, r: int, word: int) -> tf.Tensor:
    return _rotate_left(x, word - r, word)


def _xor(*values: Any) -> tf.Tensor:
    return functools.reduce(tf.bitwise.bitwise_xor, values)


def _round_function(x: tf.Tensor, word: int) -> tf.Tensor:
    """Simon's f(x) = (x <<< 1 & x <<< 8) ^ x <<< 2, on `word`-bit words."""
    both = tf.bitwise.bitwise_and(_rotate_left(x, 1, word), _rotate_left(x, 8, word))
    return _xor(both, _rotate_left(x, 2, word))


def _round_keys(seed: tf.Tensor, epoch: tf.Tensor, word: int) -> list[tf.Tensor]:
    """The key schedule of the kernel's simon_key_schedule for the key (seed, epoch, 0)."""
    mask = (1 << word) - 1
    keys = [
        tf.broadcast_to(tf.bitwise.bitwise_and(seed, mask), tf.shape(epoch)),
        tf.bitwise.bitwise_and(epoch, mask),
        tf.zeros_like(epoch),
    ]
    c, z = 0xFFFFFFFC & mask, 0x7369F885192C0EF5 & mask
    for i in range(3, ROUNDS):
        constant = tf.constant(c ^ (z & 1), epoch.dtype)
        previous = keys[i - 1]
        keys.append(
            _xor(
                constant,
                keys[i - 3],
                _rotate_right(previous, 3, word),
                _rotate_right(previous, 4, word),
            )
        )
        z >>= 1
    return keys


def _encrypt(value: tf.Tensor, keys: list[tf.Tensor], word: int) -> tf.Tensor:
    mask = (1 << word) - 1
    left = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(value, tf.constant(word, value.dtype)), mask
    )
    right = tf.bitwise.bitwise_and(value, mask)
    for i in range(0, ROUNDS, 2):
        left = _xor(left, _round_function(right, word), keys[i])
        right = _xor(right, _round_function(left, word), keys[i + 1])
    return tf.bitwise.bitwise_or(tf.bitwise.left_shift(left, tf.constant(word, value.dtype)), right)


# do_not_convert (here and below): no tensor-dependent Python control flow, no user
# code; why it pays, at tpurun.precision.float32.
@tf.autograph.experimental.do_not_convert
def index_shuffle(index: tf.Tensor, seed: int, epoch: tf.Tensor, count: int) -> tf.Tensor:
    """tf.random.experimental.index_shuffle(index, [seed, epoch, 0], count - 1, rounds=4), in
    ops XLA compiles; int32 example indices in [0, count) for int64 `index`, `epoch`."""
    if count <= 1:
        return tf.zeros_like(index, tf.int32)
    word = block_bits(count) // 2
    # The kernel reads every key word as uint32 and keeps the low `word` bits; the
    # index is taken modulo the block (it is below count, so only count = 2^B + 1
    # notices: the kernel's own quirk, kept).
    epoch = tf.cast(tf.math.floormod(epoch, 1 << word), tf.uint32)
    value = tf.cast(tf.math.floormod(index, 1 << (2 * word)), tf.uint32)
    keys = _round_keys(tf.constant(seed % (1 << 32), tf.uint32), epoch, word)
    max_index = tf.constant(count - 1, tf.uint32)
    value = _encrypt(value, keys, word)

    def walk(value: tf.Tensor) -> tuple[tf.Tensor]:  # cycle walking: until inside [0, count)
        return (tf.where(value > max_index, _encrypt(value, keys, word), value),)

    (value,) = tf.while_loop(lambda v: tf.reduce_any(v > max_index), walk, (value,))
    return tf.cast(value, tf.int32)


@tf.autograph.experimental.do_not_convert
def op_index_shuffle(index: tf.Tensor, seed: int, epoch: tf.Tensor, count: int) -> tf.Tensor:
    """`index_shuffle` by TensorFlow's own op (no XLA kernel): int32 example indices."""
    flat, epoch = tf.reshape(index, [-1]), tf.reshape(epoch, [-1])  # the op takes vectors
    key = tf.stack([tf.fill(tf.shape(flat), tf.constant(seed, tf.int64)), epoch], axis=-1)
    # The raw op: tf.random.experimental.index_shuffle pads a [n, 2] seed on the
    # wrong axis in TF 2.21.
    shuffled = tf.raw_ops.RandomIndexShuffle(
        index=flat,
        seed=tf.pad(key, [[0, 0], [0, 1]]),
        max_index=tf.constant(count - 1, tf.int64),
        rounds=ROUNDS,
    )
    return tf.reshape(tf.cast(shuffled, tf.int32), tf.shape(index))


@functools.lru_cache(maxsize=8)
def _table(count: int, seed: int) -> np.ndarray:
    """Every epoch's permutation, [2^(B/2), count]: row e is epoch e (and e + 2^(B/2), ...)."""
    period = 1 << (block_bits(count) // 2)
    epochs = tf.repeat(tf.range(period, dtype=tf.int64), count)
    offsets = tf.tile(tf.range(count, dtype=tf.int64), [period])
    return op_index_shuffle(offsets, seed, epochs, count).numpy().reshape(period, count)


class ExampleOrder:
    """The examples at positions of the training stream, for `count` examples and `seed`.

    `table` (numpy, or None) is what a replica needs besides the examples: the
    tabled permutations of a small dataset, computed here once (2^16 encryptions
    per epoch, ~0.2 s of CPU whatever the count; cached for the process).
    """

    def __init__(self, count: int, seed: int):
        if count < 1:
            raise ValueError(f"{count} examples; need at least one")
        self.count, self.seed = count, seed
        encryptions = 2 ** block_bits(count) / count
        small = count > 1 and encryptions > TABLE_ABOVE_ENCRYPTIONS  # one example: always 0
        self.table = _table(count, seed) if small else None

    @tf.autograph.experimental.do_not_convert
    def rows(self, positions: tf.Tensor, table: Any = None, compiled: bool = False) -> tf.Tensor:
        """The example (int32) at each int64 stream position.

        `table`: `self.table` as a tensor where the caller keeps it (a device),
        required when there is one; `compiled`: for a step XLA compiles.
        """
        epoch = tf.math.floordiv(positions, self.count)
        offset = tf.math.floormod(positions, self.count)
        if self.table is None:
            shuffle = index_shuffle if compiled else op_index_shuffle
            return shuffle(offset, self.seed, epoch, self.count)
        period = self.table.shape[0]
        flat = tf.math.floormod(epoch, period) * self.count + offset
        return tf.gather(tf.reshape(table, [-1]), flat)

    @tf.autograph.experimental.do_not_convert
    def batch_rows(
        self,
        first_batch: Any,
        num_batches: int,
        batch_size: int,
        pipelines: int = 1,
        pipeline: Any = 0,
        table: Any = None,
        compiled: bool = False,
    ) -> tf.Tensor:
        """The examples of batches [first_batch, first_batch + num_batches) of `pipeline`, as
        int32 [num_batches, batch_size] (`table`, `compiled`: as for `rows`)."""
        positions = batch_positions(first_batch, num_batches, batch_size, pipelines, pipeline)
        return self.rows(positions, table, compiled)


@tf.autograph.experimental.do_not_convert
def batch_positions(
    first_batch: Any, num_batches: int, batch_size: int, pipelines: int = 1, pipeline: Any = 0
) -> tf.Tensor:
    """Stream positions of batches [first_batch, first_batch + num_batches) of `pipeline` (of
    `pipelines`): int64 [num_batches, batch_size]."""
    first = tf.cast(first_batch, tf.int64) * batch_size
    local = first + tf.range(num_batches * batch_size, dtype=tf.int64)
    if pipelines > 1:  # (ops saved where there is one: a step of 8 replicas runs 8 of these)
        local = local * pipelines + tf.cast(pipeline, tf.int64)
    return tf.reshape(local, [num_batches, batch_size])
