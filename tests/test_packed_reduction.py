"""tpurun.cluster.packed_reduction: the all-reduce of replicas on logical CPUs, one tensor per dtype.

It must add up exactly what TensorFlow's stock ReductionToOneDevice adds up, bit for
bit: 1 and 8 replicas reach the same weights only if every sum is the same.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from tpurun.cluster import packed_reduction

REPLICAS = 8
# Gradients of a step: several shapes and dtypes, a scalar, one dtype alone.
SHAPES_AND_DTYPES = [
    ([4, 10], tf.float32),
    ([10], tf.float32),
    ([], tf.float32),
    ([3, 3, 2], tf.float32),
    ([5], tf.float64),
    ([2, 2], tf.float64),
    ([2, 3], tf.bfloat16),
]


def replica_values(replica: int) -> list[tf.Tensor]:
    """Replica `replica`'s values: random, of mixed magnitudes (where float rounding shows)."""
    rng = np.random.default_rng(replica)
    values = []
    for shape, dtype in SHAPES_AND_DTYPES:
        raw = rng.normal(size=shape) * 10.0 ** rng.integers(-6, 6, size=shape)
        values.append(tf.cast(raw, dtype))
    return values


@contextlib.contextmanager
def grappler_arithmetic(enabled: bool):
    """Grappler's arithmetic optimizer on or off for the tf.functions traced inside."""
    before = tf.config.optimizer.get_experimental_options().get("arithmetic_optimization")
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": enabled})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": True if before is None else before}
        )


def all_reduced(
    cross_device_ops: tf.distribute.CrossDeviceOps, compiled: bool
) -> list[list[np.ndarray]]:
    """Each replica's copy of the summed values, as Keras's optimizer all-reduces gradients."""
    strategy = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(REPLICAS)], cross_device_ops=cross_device_ops
    )
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: replica_values(ctx.replica_id_in_sync_group)
    )

    def step(values):
        return strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v),
            args=(values,),
        )

    if compiled:
        with grappler_arithmetic(False):
            summed = tf.function(step)(per_replica)
    else:
        summed = step(per_replica)
    return [[t.numpy() for t in strategy.experimental_local_results(s)] for s in summed]


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def sum_in_replica_order(k: int) -> np.ndarray:
    """Value k summed over the replicas in their order, in its own dtype: add_n's sum."""
    total = replica_values(0)[k].numpy()
    for replica in range(1, REPLICAS):
        total = (total + replica_values(replica)[k].numpy()).astype(total.dtype)
    return total


# Eagerly, and in a tf.function with grappler's arithmetic optimizer off: that one may
# reorder an AddN's inputs, differently in the two graphs (the last bit then differs
# however the values were packed), as it may in any training step.
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_packed_sums_equal_the_stock_reduction_bit_for_bit(compiled):
    packed = all_reduced(packed_reduction.PackedReductionToOneDevice(), compiled)
    stock = all_reduced(tf.distribute.ReductionToOneDevice(), compiled)
    assert len(packed) == len(stock) == len(SHAPES_AND_DTYPES)
    for k, (shape, dtype) in enumerate(SHAPES_AND_DTYPES):
        expected = sum_in_replica_order(k)
        assert len(packed[k]) == REPLICAS
        for packed_copy, stock_copy in zip(packed[k], stock[k], strict=True):
            assert packed_copy.shape == tuple(shape) and packed_copy.dtype == dtype.as_numpy_dtype
            assert bits(packed_copy) == bits(stock_copy) == bits(expected), (shape, dtype.name)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_a_dtype_with_one_value_or_a_few_reduces_alone(count):
    """One value of a dtype is reduced as it is; the packing only changes how many copies."""
    strategy = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(3)],
        cross_device_ops=packed_reduction.PackedReductionToOneDevice(),
    )
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: [tf.fill([2], float(ctx.replica_id_in_sync_group + k)) for k in range(count)]
    )
    summed = tf.function(
        lambda values: strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v),
            args=(values,),
        )
    )(per_replica)
    for k, value in enumerate(summed):
        for copy in strategy.experimental_local_results(value):
            assert copy.numpy().tolist() == [3.0 + 3 * k] * 2
