"""Trains a tiny model 3 steps on 1 and on 2 logical CPU replicas; returns the weights.

For tests/test_optimization.py, in the test process: conftest splits its CPU into
logical devices before TensorFlow initialises. The same global batch of 8 is
split 8 / 4+4 (2 replicas take the path of any number: the per-replica gradients, their
all-reduce, the mirrored variables' update; each more replica traces and runs the step again).
"""

from __future__ import annotations

import ml_collections
import numpy as np
import tensorflow as tf

from tpurun import optimization
from tpurun.cluster import strategy

GLOBAL_BATCH = 8
FEATURES = np.random.RandomState(0).normal(size=(GLOBAL_BATCH, 3)).astype("float32")
LABELS = 10 * np.random.RandomState(1).normal(size=(GLOBAL_BATCH, 1)).astype("float32")


def config(**optimizer_keys) -> ml_collections.FrozenConfigDict:
    from tests.test_optimization import recipe_config

    base = recipe_config(**optimizer_keys)
    base.train.steps = 10
    base.train.batch_size = GLOBAL_BATCH
    return ml_collections.FrozenConfigDict(base)


def keras_global_clipnorm(recipe: ml_collections.FrozenConfigDict):
    """Keras' own clipping, for comparison: SGD(global_clipnorm=...)."""
    import keras

    return keras.optimizers.SGD(recipe.optimizer.learning_rate, global_clipnorm=0.1)


def train(
    strategy: tf.distribute.Strategy,
    recipe,
    make_optimizer,
    zero_gradients: bool = False,
    l2_in_loss: float = 0.0,
) -> dict[str, list]:
    """`l2_in_loss`: add l2_in_loss x sum(tf.nn.l2_loss(kernel)) to the loss, as a TF1
    program (tensorflow/tpu's resnet_main.py) did."""
    import keras

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(1)]
        )
        optimizer = make_optimizer(recipe)
        optimizer.build(model.trainable_variables)
    initial = [v.numpy().tolist() for v in model.trainable_variables]
    replicas = strategy.num_replicas_in_sync
    per_replica = GLOBAL_BATCH // replicas

    def batch(context: tf.distribute.InputContext):
        rows = slice(context.replica_id_in_sync_group * per_replica, None)
        return FEATURES[rows][:per_replica], LABELS[rows][:per_replica]

    features, labels = (
        strategy.experimental_distribute_values_from_function(lambda c: batch(c)[0]),
        strategy.experimental_distribute_values_from_function(lambda c: batch(c)[1]),
    )

    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            if zero_gradients:
                loss *= 0.0
            if l2_in_loss:
                kernels = [v for v in model.trainable_variables if v.path.endswith("kernel")]
                penalty = l2_in_loss * tf.add_n([tf.nn.l2_loss(k) for k in kernels])
                loss += tf.nn.scale_regularization_loss(penalty)  # its share per replica
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))

    run = tf.function(lambda x, y: strategy.run(step, args=(x, y)))
    for _ in range(3):
        run(features, labels)
    result = {
        "paths": [v.path for v in model.trainable_variables],
        "initial": initial,
        "weights": [v.numpy().tolist() for v in model.trainable_variables],
    }
    if optimizer.use_ema:
        result["averages"] = [a.numpy().tolist() for _, a in optimization.ema_pairs(optimizer)]
    return result


def results() -> dict[str, dict]:
    """Every recipe's weights after 3 steps, by recipe/strategy."""
    two = strategy.local(2).strategy  # as tpurun --num_shards=2 builds it
    strategies = {
        "default": tf.distribute.get_strategy(),  # tpurun's one replica
        "mirrored_1": tf.distribute.MirroredStrategy(["/cpu:0"]),
        "mirrored_2": two,
    }
    clipped = config(name="sgd", learning_rate=1.0, clip_norm=0.1)
    full = config(
        name="sgd",
        learning_rate=0.1,
        momentum=0.9,
        nesterov=True,
        weight_decay=0.5,
        clip_norm=1.0,
        schedule="cosine",
        warmup_steps=2,
        ema_decay=0.5,
    )
    decay = config(name="sgd", learning_rate=0.1, weight_decay=0.5)
    momentum = {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True}
    l2 = config(**momentum, l2_weight_decay=0.05)
    plain = config(**momentum)
    build = optimization.build_optimizer
    found = {}
    for name, replicas in strategies.items():
        found[f"keras_clip/{name}"] = train(replicas, clipped, keras_global_clipnorm)
        found[f"clip_norm/{name}"] = train(replicas, clipped, lambda c: build(c, GLOBAL_BATCH))
        if name == "mirrored_1":
            continue  # one replica of a MirroredStrategy: clipping's case only (its tests')
        found[f"recipe/{name}"] = train(replicas, full, lambda c: build(c, GLOBAL_BATCH))
        found[f"decay/{name}"] = train(
            replicas, decay, lambda c: build(c, GLOBAL_BATCH), zero_gradients=True
        )
        found[f"l2/{name}"] = train(replicas, l2, lambda c: build(c, GLOBAL_BATCH))
    # The L2 term in the loss of a TF1 program, and no decay in the optimizer.
    found["l2_in_loss/default"] = train(
        strategies["default"], plain, lambda c: build(c, GLOBAL_BATCH), l2_in_loss=0.05
    )
    found["momentum/default"] = train(
        strategies["default"], plain, lambda c: build(c, GLOBAL_BATCH)
    )
    return found
