"""optimization and run_config.keys.recipe_keys: schedules, batch scaling, weight decay, clipping, EMA, checks."""

from __future__ import annotations

import math

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from tpurun.models.iris import Iris

from tpurun import config_defaults, optimization
from tpurun.errors import RunError, UsageError
from tpurun.optimization import schedules
from tpurun.run_config import RunConfig, merge_flags
from tpurun.run_config.keys import recipe_keys

STEPS = 1000


def recipe_config(**keys) -> ml_collections.ConfigDict:
    """base_config with train.steps=1000 and the given optimizer keys (ema_decay: train's)."""
    config = config_defaults.base_config(model="iris")
    config.train.steps = STEPS
    for key, value in keys.items():
        if key == "ema_decay":
            config.train.ema_decay = value
        else:
            config.optimizer[key] = value
    return config


def recipe(**keys) -> ml_collections.FrozenConfigDict:
    config = ml_collections.FrozenConfigDict(recipe_config(**keys))
    recipe_keys.validate(config)
    return config


def built(config, variables, global_batch_size: int = 128) -> keras.optimizers.Optimizer:
    optimizer = optimization.build_optimizer(config, global_batch_size)
    optimizer.build(variables)
    return optimizer


# Schedules: lr 0.1; `step` is the number of steps done (what Keras evaluates at).
COSINE_AT_100 = 0.1 * (0.9 * 0.5 * (1 + math.cos(math.pi * 0.1)) + 0.1)


@pytest.mark.parametrize(
    "keys, step, expected",
    [
        ({}, 0, 0.1),
        ({}, 999, 0.1),
        ({"warmup_steps": 100}, 0, 0.0),
        ({"warmup_steps": 100}, 25, 0.025),
        ({"warmup_steps": 100}, 100, 0.1),
        ({"warmup_steps": 100}, 700, 0.1),
        ({"schedule": "exponential", "decay_steps": 100, "decay_rate": 0.5}, 50, 0.1 * 0.5**0.5),
        ({"schedule": "exponential", "decay_steps": 100, "decay_rate": 0.5}, 200, 0.025),
        (
            {"schedule": "exponential", "decay_steps": 100, "decay_rate": 0.5, "staircase": True},
            150,
            0.05,
        ),
        (
            {"schedule": "piecewise", "boundaries": (100, 200), "multipliers": (1, 0.1, 0.01)},
            100,
            0.1,
        ),
        (
            {"schedule": "piecewise", "boundaries": (100, 200), "multipliers": (1, 0.1, 0.01)},
            101,
            0.01,
        ),
        (
            {"schedule": "piecewise", "boundaries": (100, 200), "multipliers": (1, 0.1, 0.01)},
            201,
            0.001,
        ),
        # Past 2**24 steps, where float32 no longer tells neighbouring steps apart.
        (
            {"schedule": "piecewise", "boundaries": (2**25 + 1,), "multipliers": (1, 0.1)},
            2**25 + 1,
            0.1,
        ),
        (
            {"schedule": "piecewise", "boundaries": (2**25 + 1,), "multipliers": (1, 0.1)},
            2**25 + 2,
            0.01,
        ),
        ({"schedule": "cosine", "alpha": 0.1}, 0, 0.1),
        ({"schedule": "cosine", "alpha": 0.1}, 500, 0.055),
        ({"schedule": "cosine", "alpha": 0.1}, 1000, 0.01),
        ({"schedule": "cosine", "alpha": 0.1}, 5000, 0.01),
        ({"schedule": "cosine", "alpha": 0.1, "warmup_steps": 100}, 50, COSINE_AT_100 / 2),
        ({"schedule": "cosine", "alpha": 0.1, "warmup_steps": 100}, 100, COSINE_AT_100),
        ({"schedule": "linear", "end_learning_rate": 0.01}, 500, 0.055),
        ({"schedule": "linear", "end_learning_rate": 0.01}, 1000, 0.01),
        ({"schedule": "linear", "warmup_steps": 200}, 100, 0.04),
    ],
    ids=lambda v: (
        repr(v) if not isinstance(v, dict) else ",".join(f"{k}={v[k]}" for k in v) or "constant"
    ),
)
def test_schedule_value_at_a_step(keys, step, expected):
    config = recipe(learning_rate=0.1, **keys)
    optimizer = built(config, [keras.Variable([1.0])])
    assert float(optimization.learning_rate_at(optimizer, step)) == pytest.approx(
        expected, rel=1e-6, abs=1e-9
    )


def resnet_main_rate(step: int, batch: int = 1024, examples: int = 1_281_167) -> float:
    """tensorflow/tpu's resnet_main.py learning_rate_schedule for 90 epochs, restated: 0.1 per
    256 examples, linear warmup over 5 epochs, x0.1 from epochs 30, 60 and 80."""
    scaled = 0.1 * batch / 256
    epoch = step / (examples / batch)
    rate = scaled * epoch / 5
    for multiplier, start in ((1.0, 5), (0.1, 30), (0.01, 60), (0.001, 80)):
        rate = rate if epoch < start else scaled * multiplier
    return rate


def test_the_recipe_in_epochs_is_resnet_mains_schedule_step_by_step(tmp_path):
    from tpurun.run_config import epochs

    config = recipe_config(
        name="sgd",
        learning_rate=0.1,
        base_batch_size=256,
        warmup_epochs=5,
        schedule="piecewise",
        boundary_epochs=(30, 60, 80),
        multipliers=(1.0, 0.1, 0.01, 0.001),
    )
    config.data = ml_collections.ConfigDict({"train_examples": 1_281_167})
    config = merge_flags(config, {"batch_size": 1024, "train_epochs": 90})
    run = RunConfig(command="train", config_name="r", config=config, model_dir=str(tmp_path))
    resolved = epochs.resolve_length(run)
    recipe = resolved.config.optimizer
    # ceil(5 x 1281167 / 1024) = 6256; the last steps at each rate: 37534, 75068, 100091.
    assert (recipe.warmup_steps, tuple(recipe.boundaries)) == (6256, (37534, 75068, 100091))
    assert (recipe.warmup_epochs, tuple(recipe.boundary_epochs)) == (0.0, ())
    # ceil(90 epochs x 1281167 / 1024); resnet_config.py's 112590 is 90 x floor(1281167 / 1024).
    assert resolved.train_steps == 112_603
    optimizer = built(resolved.config, [keras.Variable([1.0])], global_batch_size=1024)
    changes = [s + d for s in (0, 6256, 37534, 75068, 100091) for d in (-1, 0, 1, 2)]
    for step in [s for s in changes if s >= 0] + [3000, 112_589]:
        ours = float(optimization.learning_rate_at(optimizer, step))
        # The warmup ends at step 6256, resnet_main's at 6255.70: 5e-5 apart in its slope.
        assert ours == pytest.approx(resnet_main_rate(step), rel=1e-4 if step < 6256 else 1e-6), (
            step
        )


def test_the_optimizer_evaluates_its_schedule_at_its_step():
    """A resumed run (iterations restored) continues on the curve."""
    config = recipe(learning_rate=0.1, schedule="cosine")
    optimizer = built(config, [keras.Variable([1.0])])
    optimizer.iterations.assign(500)
    assert float(optimizer.learning_rate) == pytest.approx(0.05, rel=1e-6)


@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_matches_tf1_exponential_decay(staircase):
    config = recipe(
        learning_rate=0.1,
        schedule="exponential",
        decay_steps=350,
        decay_rate=0.94,
        staircase=staircase,
    )
    schedule = schedules.learning_rate(config, global_batch_size=128)
    steps = list(range(0, 20_000, 173))
    ours = [float(schedule(step)) for step in steps]
    tf1 = []
    for step in steps:
        value = tf.compat.v1.train.exponential_decay(0.1, step, 350, 0.94, staircase=staircase)
        tf1.append(float(value() if callable(value) else value))
    np.testing.assert_allclose(ours, tf1, rtol=0, atol=1e-7)


def test_the_schedule_serializes_and_comes_back_equal():
    config = recipe(schedule="piecewise", boundaries=(10, 20), multipliers=(1.0, 0.5, 0.25))
    schedule = schedules.learning_rate(config, global_batch_size=128)
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert isinstance(again, schedules.Schedule)
    assert [float(again(s)) for s in (5, 15, 25)] == [float(schedule(s)) for s in (5, 15, 25)]


# Batch scaling: derived when the optimizer is built, from the final batch size.


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_batch_scaling_follows_the_batch_size_flag(schedule):
    config = recipe_config(learning_rate=0.1, base_batch_size=256, schedule=schedule)
    config.train.batch_size = 128
    merged = merge_flags(config, {"batch_size": 1024})  # --batch_size=1024
    optimizer = Iris(merged).optimizer()  # the Model hook: config.train.batch_size
    optimizer.build([keras.Variable([1.0])])
    assert float(optimization.learning_rate_at(optimizer, 0)) == pytest.approx(0.4)


def test_no_batch_scaling_by_default():
    merged = merge_flags(recipe_config(learning_rate=0.1), {"batch_size": 1024})
    assert schedules.peak_learning_rate(merged.optimizer, 1024) == 0.1


# Weight decay: zero gradients, so only the decay moves a weight.


def decay_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((2,)),
            keras.layers.Dense(3, name="dense", bias_initializer="ones"),
            keras.layers.BatchNormalization(name="norm", beta_initializer="ones"),
            keras.layers.Dense(1, name="head", bias_initializer="ones"),
        ],
        name="net",
    )


def decayed_paths(**keys) -> set[str]:
    model = decay_model()
    before = {v.path: v.numpy() for v in model.trainable_variables}
    optimizer = built(
        recipe(name="sgd", learning_rate=0.1, weight_decay=0.5, **keys), model.trainable_variables
    )
    for _ in range(2):
        optimizer.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])
    decayed = set()
    for variable in model.trainable_variables:
        old = before[variable.path]
        if np.allclose(variable.numpy(), old * (1 - 0.1 * 0.5) ** 2, rtol=1e-6):
            decayed.add(variable.path)
        else:
            np.testing.assert_array_equal(variable.numpy(), old, err_msg=variable.path)
    return decayed


def test_weight_decay_shrinks_the_kernels_but_not_biases_and_norm_parameters():
    assert decayed_paths() == {"net/dense/kernel", "net/head/kernel"}


def test_weight_decay_exclude_is_a_regex_over_variable_paths():
    decayed = decayed_paths(weight_decay_exclude=r"^net/head/")
    assert decayed == {"net/dense/kernel", "net/dense/bias", "net/norm/gamma", "net/norm/beta"}


@pytest.mark.parametrize(
    "path, excluded",
    [
        ("dense/bias", True),
        ("model/batch_normalization/gamma", True),
        ("layer_normalization/beta", True),
        ("rms_normalization/scale", True),
        ("bias", True),
        ("dense/kernel", False),
        ("bias_net/kernel", False),
        ("embedding/embeddings", False),
        ("dense/unbias", False),
    ],
)
def test_default_weight_decay_exclusion(path, excluded):
    pattern = config_defaults.base_config(model="x").optimizer.weight_decay_exclude
    assert bool(__import__("re").search(pattern, path)) is excluded


# Clipping: by the global norm of the (summed) gradients.


@pytest.mark.parametrize(
    "gradient_norm, update_norm", [(10.0, 0.5), (0.2, 0.2)], ids=["clipped", "below"]
)
def test_clip_norm_bounds_the_update(gradient_norm, update_norm):
    variables = [
        keras.Variable(np.zeros((3, 2), "float32")),
        keras.Variable(np.zeros(2, "float32")),
    ]
    optimizer = built(recipe(name="sgd", learning_rate=1.0, clip_norm=0.5), variables)
    raw = [np.full((3, 2), 1.0, "float32"), np.full(2, 2.0, "float32")]
    scale = gradient_norm / math.sqrt(sum(float(np.sum(g**2)) for g in raw))
    optimizer.apply_gradients(
        [(tf.constant(g * scale), v) for g, v in zip(raw, variables, strict=True)]
    )
    moved = math.sqrt(sum(float(np.sum(v.numpy() ** 2)) for v in variables))
    assert moved == pytest.approx(update_norm, rel=1e-5)
    # The direction is kept: every gradient is scaled by the same factor.
    np.testing.assert_allclose(
        variables[1].numpy() / variables[0].numpy()[0, 0], [2.0, 2.0], rtol=1e-5
    )


def test_clipping_takes_the_norm_of_sparse_gradients_with_repeated_rows_summed():
    # Two rows for index 0 (as an embedding looked up twice): the dense row is [4, 0].
    sparse = tf.IndexedSlices(
        tf.constant([[3.0, 0.0], [1.0, 0.0]]), tf.constant([0, 0]), tf.constant([2, 2])
    )
    (clipped,) = optimization.clip_by_global_norm([sparse], clip_norm=2.0)
    assert isinstance(clipped, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(clipped).numpy(), [[2.0, 0.0], [0.0, 0.0]])


@pytest.fixture(scope="module")
def replicas() -> dict[str, dict]:
    """tests/optimization_replicas.py: 3 steps on the default strategy, 1 and 2 replicas."""
    from tests import optimization_replicas

    return optimization_replicas.results()


def flat(result: dict, *parts: str) -> np.ndarray:
    return np.concatenate(
        [np.ravel(np.asarray(v, "float32")) for part in parts for v in result[part]]
    )


def test_keras_global_clipnorm_clips_each_replica_before_the_sum(replicas):
    """Evidence for tpurun's own clipping: Keras' differs between 1 and 2 replicas."""
    one, two = (
        flat(replicas["keras_clip/default"], "weights"),
        flat(replicas["keras_clip/mirrored_2"], "weights"),
    )
    assert np.abs(one - two).max() > 1e-2, (
        "Keras now clips after the all-reduce: see optimization.py"
    )


@pytest.mark.parametrize("one", ["default", "mirrored_1"])
def test_clip_norm_is_the_same_on_one_and_two_replicas(replicas, one):
    clipped = flat(replicas[f"clip_norm/{one}"], "weights")
    np.testing.assert_allclose(
        clipped, flat(replicas["clip_norm/mirrored_2"], "weights"), atol=1e-6
    )
    # ...and clipping was on: the same steps as Keras' clipping on one replica.
    np.testing.assert_allclose(clipped, flat(replicas[f"keras_clip/{one}"], "weights"), atol=1e-6)


def test_the_whole_recipe_is_the_same_on_one_and_two_replicas(replicas):
    """SGD + nesterov, cosine with warmup, weight decay, clipping and EMA."""
    one, two = replicas["recipe/default"], replicas["recipe/mirrored_2"]
    np.testing.assert_allclose(
        flat(one, "weights", "averages"), flat(two, "weights", "averages"), atol=1e-6
    )


@pytest.mark.parametrize("strategy", ["default", "mirrored_2"])
def test_weight_decay_exclusion_holds_on_replicas(replicas, strategy):
    result = replicas[f"decay/{strategy}"]
    for path, before, after in zip(
        result["paths"], result["initial"], result["weights"], strict=True
    ):
        factor = 1.0 if path.endswith("bias") else (1 - 0.1 * 0.5) ** 3
        np.testing.assert_allclose(after, np.asarray(before) * factor, rtol=1e-6, err_msg=path)


@pytest.mark.parametrize("strategy", ["default", "mirrored_2"])
def test_l2_weight_decay_is_the_l2_loss_of_a_tf1_program(replicas, strategy):
    """SGD with Nesterov momentum and l2_weight_decay on 1 or 2 replicas takes the steps of
    plain SGD on the loss + l2 x sum(tf.nn.l2_loss(kernel)) (resnet_main.py's): the term
    goes through the momentum, and the biases are not decayed."""
    np.testing.assert_allclose(
        flat(replicas[f"l2/{strategy}"], "weights"),
        flat(replicas["l2_in_loss/default"], "weights"),
        rtol=1e-5,
        atol=1e-6,
    )
    # ...and it decays: without it the weights differ.
    plain = flat(replicas["momentum/default"], "weights")
    assert np.abs(flat(replicas[f"l2/{strategy}"], "weights") - plain).max() > 1e-3


# EMA: Keras' averages, kept by the optimizer.


def ema_training(steps: int, ema_decay: float = 0.5):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = built(
        recipe(name="sgd", learning_rate=0.1, ema_decay=ema_decay), model.trainable_variables
    )
    x = tf.constant(np.random.RandomState(0).normal(size=(4, 3)), tf.float32)
    history = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - 1.0))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        history.append([v.numpy() for v in model.trainable_variables])
    return model, optimizer, history


def test_ema_follows_the_recurrence_and_differs_from_the_weights():
    model, optimizer, history = ema_training(steps=5, ema_decay=0.5)
    expected = history[0]  # the first step copies the weights
    for weights in history[1:]:
        expected = [0.5 * a + 0.5 * w for a, w in zip(expected, weights, strict=True)]
    pairs = optimization.ema_pairs(optimizer)
    for (variable, average), value in zip(pairs, expected, strict=True):
        np.testing.assert_allclose(average.numpy(), value, rtol=1e-6)
        assert not np.allclose(average.numpy(), variable.numpy())


def test_swap_in_ema_puts_the_weights_back():
    model, optimizer, history = ema_training(steps=3)
    averages = [a.numpy() for _, a in optimization.ema_pairs(optimizer)]
    with optimization.swap_in_ema(optimizer):
        for variable, average in zip(model.trainable_variables, averages, strict=True):
            np.testing.assert_array_equal(variable.numpy(), average)
    for variable, raw in zip(model.trainable_variables, history[-1], strict=True):
        np.testing.assert_array_equal(variable.numpy(), raw)


def test_averages_are_saved_with_the_optimizer_and_an_evaluator_restores_them(tmp_path):
    model, optimizer, history = ema_training(steps=3)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt-3"))
    averages = [a.numpy() for _, a in optimization.ema_pairs(optimizer)]
    keras.utils.set_random_seed(2)
    evaluator_model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimization.restore_ema_weights(
        evaluator_model, recipe(name="sgd", learning_rate=0.1, ema_decay=0.5), path
    )
    for variable, average in zip(evaluator_model.trainable_variables, averages, strict=True):
        np.testing.assert_array_equal(variable.numpy(), average)


def test_restoring_averages_from_a_checkpoint_without_them_fails(tmp_path):
    model, optimizer, _ = ema_training(steps=2, ema_decay=0.0)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt-2"))
    with pytest.raises(RunError, match="has no moving averages for this config"):
        optimization.restore_ema_weights(
            model, recipe(name="sgd", learning_rate=0.1, ema_decay=0.5), path
        )


# Keys passed to the Keras optimizer, and the builder's errors.


def test_other_optimizer_keys_reach_the_keras_constructor():
    config = recipe_config()
    config.optimizer.beta_1 = 0.8
    optimizer = optimization.build_optimizer(ml_collections.FrozenConfigDict(config), 128)
    assert optimizer.beta_1 == 0.8


def test_sgd_gets_momentum_and_nesterov():
    optimizer = optimization.build_optimizer(recipe(name="sgd", momentum=0.9, nesterov=True), 128)
    assert (optimizer.momentum, optimizer.nesterov) == (0.9, True)


@pytest.mark.parametrize(
    "name, key, value, words",
    [
        ("adam", "rho", 0.9, ["config.optimizer.rho=0.9", "not an argument of", "Adam", "beta_1"]),
        ("no_such", None, None, ["config.optimizer.name='no_such'", "adam, adamax, adamw", "sgd"]),
    ],
    ids=["key_the_optimizer_does_not_take", "unknown_optimizer"],
)
def test_build_errors_name_the_key(name, key, value, words):
    config = recipe_config(name=name)
    if key:
        config.optimizer[key] = value
    with pytest.raises(UsageError) as raised:
        optimization.build_optimizer(ml_collections.FrozenConfigDict(config), 128)
    message = str(raised.value)
    assert "\n" not in message and all(w in message for w in words), message


# Bad values: one line naming the key, the value and what is allowed, before TensorFlow.


@pytest.mark.parametrize(
    "keys, words",
    [
        (
            {"schedule": "cosin"},
            [
                "config.optimizer.schedule='cosin'",
                "constant, exponential, piecewise, cosine, linear",
            ],
        ),
        ({"warmup_steps": -1}, ["config.optimizer.warmup_steps=-1", ">= 0"]),
        ({"clip_norm": -1.0}, ["config.optimizer.clip_norm=-1.0", ">= 0"]),
        (
            {"schedule": "exponential", "decay_steps": 100, "decay_rate": 0.0},
            ["config.optimizer.decay_rate=0.0", "> 0"],
        ),
        (
            {"schedule": "exponential", "decay_steps": 100, "decay_rate": -0.5},
            ["config.optimizer.decay_rate=-0.5", "> 0"],
        ),
        (
            {"schedule": "exponential", "decay_rate": 0.9},
            ["config.optimizer.decay_steps=0", ">= 1"],
        ),
        (
            {"schedule": "piecewise", "boundaries": (200, 100), "multipliers": (1, 0.1, 0.01)},
            ["config.optimizer.boundaries=(200, 100)", "increasing"],
        ),
        (
            {"schedule": "piecewise", "boundaries": (100,), "multipliers": (1.0,)},
            ["config.optimizer.multipliers=(1.0,)", "2 numbers", "1 boundaries"],
        ),
        ({"schedule": "cosine", "alpha": 1.5}, ["config.optimizer.alpha=1.5", "[0, 1]"]),
        (
            {"schedule": "linear", "end_learning_rate": -0.1},
            ["config.optimizer.end_learning_rate=-0.1", ">= 0"],
        ),
        (
            {"schedule": "cosine", "decay_rate": 0.9},
            ["config.optimizer.decay_rate=0.9", "schedule='exponential'", "not of 'cosine'"],
        ),
        ({"ema_decay": 1.0}, ["config.train.ema_decay=1.0", "[0, 1)"]),
        ({"ema_decay": -0.1}, ["config.train.ema_decay=-0.1", "[0, 1)"]),
        ({"momentum": 0.9}, ["config.optimizer.momentum=0.9", "does not apply to adam", "sgd"]),
        ({"name": "sgd", "momentum": 1.0}, ["config.optimizer.momentum=1.0", "[0, 1)"]),
        ({"name": "sgd", "nesterov": True}, ["config.optimizer.nesterov=True", "momentum > 0"]),
        (
            {"name": "rmsprop", "momentum": 0.9, "nesterov": True},
            ["config.optimizer.nesterov=True", "does not apply to rmsprop"],
        ),
        ({"weight_decay": -0.1}, ["config.optimizer.weight_decay=-0.1", ">= 0"]),
        ({"name": "adamw"}, ["config.optimizer.weight_decay=0.0", "adamw", "0.004"]),
        (
            {"weight_decay_exclude": "(bias"},
            ["config.optimizer.weight_decay_exclude='(bias'", "not a regex"],
        ),
        ({"base_batch_size": -256}, ["config.optimizer.base_batch_size=-256", ">= 0"]),
        ({"learning_rate": -0.1}, ["config.optimizer.learning_rate=-0.1", ">= 0"]),
        ({"clipnorm": 1.0}, ["config.optimizer.clipnorm=1.0", "config.optimizer.clip_norm"]),
        ({"warmup_epochs": -1.0}, ["config.optimizer.warmup_epochs=-1.0", ">= 0"]),
        (
            {"warmup_epochs": 5.0, "warmup_steps": 10},
            ["config.optimizer.warmup_epochs=5.0", "warmup_steps=10", "give one"],
        ),
        (
            {"schedule": "piecewise", "boundary_epochs": (60, 30), "multipliers": (1, 0.1, 0.01)},
            ["config.optimizer.boundary_epochs=(60, 30)", "increasing epochs"],
        ),
        (
            {"schedule": "piecewise", "boundary_epochs": (30,), "multipliers": (1.0,)},
            ["config.optimizer.multipliers=(1.0,)", "2 numbers", "1 boundary_epochs"],
        ),
        (
            {
                "schedule": "piecewise",
                "boundary_epochs": (30,),
                "boundaries": (100,),
                "multipliers": (1, 0.1),
            },
            ["config.optimizer.boundary_epochs=(30,)", "boundaries=(100,)", "give one"],
        ),
        (
            {"boundary_epochs": (30,)},
            ["config.optimizer.boundary_epochs=(30,)", "schedule='piecewise'", "not of 'constant'"],
        ),
        ({"l2_weight_decay": -1e-4}, ["config.optimizer.l2_weight_decay=-0.0001", ">= 0"]),
        ({"use_ema": True}, ["config.optimizer.use_ema=True", "config.train.ema_decay"]),
    ],
    ids=lambda v: ",".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else None,
)
def test_a_bad_value_is_one_line_naming_key_value_and_range(keys, words):
    config = ml_collections.FrozenConfigDict(recipe_config(**keys))
    with pytest.raises(UsageError) as raised:
        RunConfig(command="train", config_name="iris", config=config, model_dir="/tmp/m")
    message = str(raised.value)
    assert "\n" not in message, message
    missing = [w for w in words if w not in message]
    assert not missing, f"{missing} not in {message!r}"


def test_every_recipe_key_has_a_default():
    optimizer = config_defaults.base_config(model="x").optimizer
    assert set(optimizer.keys()) == set(recipe_keys.RECIPE_KEYS)
    assert "ema_decay" in config_defaults.base_config(model="x").train


# google-research/bert's optimization.py, restated: the rate, then AdamWeightDecayOptimizer.
BERT_LR, BERT_WARMUP = 1e-4, 100


def bert_rate(step: int) -> float:
    """create_optimizer: polynomial_decay(power 1) to 0 at STEPS, init_lr x step / warmup
    while step < warmup (the decay counted from step 0)."""
    decayed = BERT_LR * (1 - min(step, STEPS) / STEPS)
    return BERT_LR * step / BERT_WARMUP if step < BERT_WARMUP else decayed


def bert_recipe() -> ml_collections.FrozenConfigDict:
    return recipe(
        name="adamweightdecay", learning_rate=BERT_LR, schedule="linear",
        warmup_steps=BERT_WARMUP, warmup_target="peak", weight_decay=0.01,
        weight_decay_exclude="LayerNorm|layer_norm|bias", beta_1=0.9, beta_2=0.999, epsilon=1e-6,
    )  # fmt: skip


@pytest.mark.parametrize("step", [0, 1, 50, 99, 100, 101, 500, 999, 1000, 1200])
def test_warmup_to_the_peak_is_optimization_pys_rate(step):
    optimizer = built(bert_recipe(), [keras.Variable([1.0])])
    assert float(optimization.learning_rate_at(optimizer, step)) == pytest.approx(
        bert_rate(step),
        rel=1e-6,
        abs=1e-6 * BERT_LR,  # float32, as TF1 computed it
    )


def test_adam_weight_decay_is_optimization_pys_update():
    """Three steps from step 600 (past the warmup) on a decayed kernel and an excluded bias:
    m and v without bias correction, epsilon outside the root, w -= rate x (update + 0.01 w)."""
    kernel = keras.Variable(np.array([[0.5, -1.0], [2.0, 0.25]], np.float32), name="kernel")
    bias = keras.Variable(np.array([0.3, -0.2], np.float32), name="bias")
    optimizer = built(bert_recipe(), [kernel, bias])
    optimizer.iterations.assign(600)
    want = {"kernel": kernel.numpy().astype(np.float64), "bias": bias.numpy().astype(np.float64)}
    moments = {name: [np.zeros_like(w), np.zeros_like(w)] for name, w in want.items()}
    rng = np.random.default_rng(0)
    for step in range(600, 603):
        grads = {name: rng.normal(size=w.shape) for name, w in want.items()}
        optimizer.apply_gradients(
            [
                (tf.constant(grads["kernel"], tf.float32), kernel),
                (tf.constant(grads["bias"], tf.float32), bias),
            ]
        )
        for name, w in want.items():
            m, v = moments[name]
            m[...] = 0.9 * m + 0.1 * grads[name]
            v[...] = 0.999 * v + 0.001 * grads[name] ** 2
            update = m / (np.sqrt(v) + 1e-6) + (0.01 * w if name == "kernel" else 0.0)
            want[name] = w - bert_rate(step) * update
    np.testing.assert_allclose(kernel.numpy(), want["kernel"], rtol=1e-6)
    np.testing.assert_allclose(bias.numpy(), want["bias"], rtol=1e-6)


def test_a_warmup_target_that_is_not_one_is_refused():
    with pytest.raises(
        UsageError, match="warmup_target='top' is not a warmup target; use one of schedule, peak"
    ):
        recipe(warmup_target="top")
