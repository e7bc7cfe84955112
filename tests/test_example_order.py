"""example_order: index_shuffle's permutation, bit for bit, in the ops XLA compiles and in a table.

The training stream of in-memory examples (tf.data's seekable_batches and device
data alike) is TensorFlow's RandomIndexShuffle permutation of every epoch. The op
has no XLA kernel, so example_order has a twin in plain integer ops for compiled
steps, and a table of every epoch for small datasets: each is held here to the
op's own output.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import needs_xla_cpu

from tpurun.inputs import example_order
from tpurun.inputs.example_order import ExampleOrder


def op_rows(positions: np.ndarray, seed: int, count: int) -> np.ndarray:
    """What TensorFlow's own op gives for stream positions."""
    positions = tf.constant(positions, tf.int64)
    return example_order.op_index_shuffle(
        positions % count, seed, positions // count, count
    ).numpy()


def compiled_twin(seed: int, count: int):
    return tf.function(
        lambda index, epoch: example_order.index_shuffle(index, seed, epoch, count),
        jit_compile=True,
    )


# Counts around the cipher's block sizes: the 16-bit minimum (Iris's 120 rows), its
# edge 65536 and 65537 (whose max index 2^16 is outside the block: the kernel's
# quirk), 18- and 20-bit blocks; seeds and epochs beyond the truncated key words.
@pytest.mark.parametrize(
    "count, seed",
    [(2, 0), (3, 7), (120, 2**32 - 1), (1000, 300), (65536, 1), (65537, 2), (300000, 9)],
)
@needs_xla_cpu
def test_the_compiled_twin_is_the_op_bit_for_bit(count, seed):
    index = tf.range(min(count, 3000), dtype=tf.int64)
    epochs = [0, 1, 255, 256, 12345, 2**40]
    index = tf.tile(index, [len(epochs)])
    epoch = tf.repeat(tf.constant(epochs, tf.int64), tf.size(index) // len(epochs))
    expected = example_order.op_index_shuffle(index, seed, epoch, count).numpy()
    np.testing.assert_array_equal(compiled_twin(seed, count)(index, epoch).numpy(), expected)


def test_one_example_is_always_example_zero():
    positions = tf.range(5, dtype=tf.int64)
    np.testing.assert_array_equal(ExampleOrder(1, 3).rows(positions, compiled=True), [0] * 5)


@pytest.mark.parametrize("count", [2, 120, 8191])
def test_small_datasets_table_every_epoch_as_the_op_orders_it(count):
    order = ExampleOrder(count, 5)
    assert order.table is not None and order.table.shape == (256, count)
    positions = np.arange(300 * count, dtype=np.int64)[:: max(1, count // 7)]  # 300 epochs
    rows = order.rows(tf.constant(positions), tf.constant(order.table)).numpy()
    np.testing.assert_array_equal(rows, op_rows(positions, 5, count))


def test_with_16_bit_blocks_epoch_e_and_e_plus_256_are_the_same_permutation():
    """Why the table has 256 rows: the op keeps 8 bits of the epoch (and of the seed)."""
    first = op_rows(np.arange(120), 0, 120)
    np.testing.assert_array_equal(op_rows(np.arange(256 * 120, 257 * 120), 0, 120), first)
    assert not np.array_equal(op_rows(np.arange(120, 240), 0, 120), first)


@pytest.mark.parametrize("compiled", [False, True], ids=["op", "compiled"])
def test_large_datasets_shuffle_each_example_where_its_batch_is_made(compiled):
    order = ExampleOrder(70000, 11)
    assert order.table is None  # about one encryption per example
    positions = np.arange(0, 3 * 70000, 37, dtype=np.int64)
    rows = order.rows(tf.constant(positions), compiled=compiled)
    np.testing.assert_array_equal(rows.numpy(), op_rows(positions, 11, 70000))


def test_every_epoch_visits_every_example_once():
    order = ExampleOrder(1000, 0)
    epochs = order.rows(tf.range(3000, dtype=tf.int64), tf.constant(order.table)).numpy()
    for epoch in epochs.reshape(3, 1000):
        assert sorted(epoch) == list(range(1000))


def test_pipelines_take_interleaved_positions_of_one_stream():
    shared = example_order.batch_positions(0, 2, 3, pipelines=1).numpy().ravel()
    first = example_order.batch_positions(0, 1, 3, pipelines=2, pipeline=0).numpy().ravel()
    second = example_order.batch_positions(0, 1, 3, pipelines=2, pipeline=1).numpy().ravel()
    np.testing.assert_array_equal(shared[0::2], first)
    np.testing.assert_array_equal(shared[1::2], second)
    np.testing.assert_array_equal(
        example_order.batch_positions(5, 2, 4).numpy(), np.arange(20, 28).reshape(2, 4)
    )
