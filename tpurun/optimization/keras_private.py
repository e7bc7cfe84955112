"""The private attributes of Keras and tf.distribute this package relies on, and `missing`.

Each is checked where it is used (a Keras without the all-reduce hook refuses to clip
rather than not clip), and `missing` lists those this Keras lacks: tests/test_tf_internals.py
asserts none is.
"""

from __future__ import annotations

import keras
import tensorflow as tf

# Keras' private hook this module extends (see the module docstring); checked when an
# optimizer is built, so a Keras without it fails loudly instead of not clipping.
ALL_REDUCE_HOOK = "_all_reduce_sum_gradients"
# Keras' list of averages, parallel to the variables the optimizer was built on.
AVERAGES = "_model_variables_moving_average"
# Keras' schedule (or rate variable) and the variables the optimizer was built on.
SCHEDULE = "_learning_rate"
BUILT_ON = "_trainable_variables"


def missing() -> list[str]:
    """The private Keras attributes this module uses that this Keras lacks.

    tests/test_tf_internals.py asserts none is: clipping without the all-reduce hook
    refuses to build (rather than not clip), EMA without the averages' list fails to
    read them, and without the schedule the learning_rate scalar shows the current rate.
    """
    optimizer = keras.optimizers.SGD(use_ema=True)
    optimizer.build([keras.Variable(1.0)])
    absent = [
        name
        for name in (ALL_REDUCE_HOOK, AVERAGES, SCHEDULE, BUILT_ON)
        if not hasattr(optimizer, name)
    ]
    extended = tf.distribute.get_strategy().extended
    return absent + [name for name in REDUCE_PATHS if not hasattr(extended, name)]


# tf.distribute's private choice between its two replica-context reductions (what
# ReplicaContext.all_reduce calls), for `sum_over_replicas`.
REDUCE_PATHS = ("_use_merge_call", "_replica_ctx_all_reduce")
