"""tpurun.training_step: the Step a model's train_step gets, and the TrainState a run owns.

Which global rows a replica's keyed draws are for, the global-batch mean, named
optimizers on the variables each owns with schedules that follow the global step
(not their own iterations), the checkpoint's parts, and an older checkpoint (no
global step) resuming at its optimizer's step.
"""

from __future__ import annotations

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from tpurun import config_defaults, optimization
from tpurun.cluster import strategy
from tpurun.errors import RunError
from tpurun.training_step import OPTIMIZER
from tpurun.training_step.state import TrainState


def dense(name: str) -> keras.Model:
    inputs = keras.Input((2,), name=f"{name}_in")
    return keras.Model(inputs, keras.layers.Dense(1, name=f"{name}_dense")(inputs), name=name)


def named_config(**recipe) -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="x")
    config.train.steps = 100
    for name in ("generator", "critic"):
        config.optimizers[name] = config_defaults.optimizer_recipe(**recipe)
    return config


def state_of(config, models=None, variables=None, precision="float32") -> TrainState:
    models = models or {"generator": dense("generator"), "critic": dense("critic")}
    names = list(config.optimizers)
    variables = variables or {n: models[n].trainable_variables for n in names}
    return TrainState(
        models,
        "generator",
        names,
        variables,
        lambda name: optimization.build_optimizer(config, 32, name),
        precision,
        "Gan",
    )


def test_a_replicas_rows_are_its_slice_of_the_global_batch():
    two = strategy.local(2).strategy
    with two.scope():
        state = state_of(named_config())

    def rows(features):
        step = state.step_of(0, 8, rows=4, micro_batches=2)
        with step.micro_batch(1):
            micro = step.random.rows
        return step.random.rows, micro, step.mean(tf.ones([4]))

    run = tf.function(lambda: two.run(rows, args=(tf.zeros([4]),)))
    first, micro, mean = (two.experimental_local_results(v) for v in run())
    assert [r.numpy().tolist() for r in first] == [[0, 1, 2, 3], [8, 9, 10, 11]]
    # Micro-batch 1 of replica r is batch r * 2 + 1 of the step.
    assert [r.numpy().tolist() for r in micro] == [[4, 5, 6, 7], [12, 13, 14, 15]]
    # A share of the mean over the whole step: 4 of 16 examples each.
    assert [float(m) for m in mean] == [0.25, 0.25]


def test_named_optimizers_update_their_own_variables_on_a_schedule_of_the_global_step():
    config = named_config(learning_rate=0.1, schedule="linear", end_learning_rate=0.0)
    state = state_of(config)
    critic, generator = state.optimizers["critic"], state.optimizers["generator"]
    assert [v.path for v in state.variables["critic"]] == [
        "critic_dense/kernel",
        "critic_dense/bias",
    ]
    state.global_step.assign(50)
    for _ in range(3):  # three critic updates in one step: its iterations run ahead
        critic.apply(
            [tf.ones_like(v) for v in state.variables["critic"]], state.variables["critic"]
        )
    assert int(critic.iterations) == 3 and int(generator.iterations) == 0
    # Both rates are the schedule's at the global step 50, not at their own iterations.
    assert state.learning_rates() == pytest.approx({"critic": 0.05, "generator": 0.05})
    assert float(critic.learning_rate) == pytest.approx(0.05)


def test_the_checkpoint_holds_every_model_optimizer_and_the_step(tmp_path):
    state = state_of(named_config())
    state.global_step.assign(7)
    path = state.checkpoint().write(str(tmp_path / "ckpt-7"))
    keys = {k.split("/")[0] for k, _ in tf.train.list_variables(path)}
    assert {"optimizers", "model_variables", "step"} <= keys
    names = [k for k, _ in tf.train.list_variables(path)]
    assert any(k.startswith("optimizers/critic/") for k in names)
    assert any(k.startswith("optimizers/generator/") for k in names)
    fresh = state_of(named_config())
    fresh.checkpoint(present=keys).read(path).assert_existing_objects_matched()
    fresh.restored()
    assert fresh.step == 7


def test_an_older_checkpoint_without_a_step_resumes_at_its_optimizers(tmp_path):
    config = config_defaults.base_config(model="x")
    model = dense("model")

    def single() -> TrainState:
        return TrainState(
            {"model": model},
            "model",
            [],
            {OPTIMIZER: model.trainable_variables},
            lambda name: optimization.build_optimizer(config, 32),
            "float32",
            "M",
        )

    old = single()
    optimizer = old.optimizers[OPTIMIZER]
    for _ in range(5):
        optimizer.apply([tf.ones_like(v) for v in model.trainable_variables])
    # What tpurun 0.2 saved: model, optimizer, model_variables; no step.
    path = tf.train.Checkpoint(
        model=model, optimizer=optimizer, model_variables=list(model.variables)
    ).write(str(tmp_path / "ckpt-5"))
    new = single()
    present = {k.split("/")[0] for k, _ in tf.train.list_variables(path)}
    assert "step" not in present
    new.checkpoint(present).read(path).assert_existing_objects_matched()
    new.restored()
    assert new.step == 5


@pytest.mark.parametrize(
    "variables, message",
    [
        (lambda m: {"critic": m["critic"].trainable_variables}, "names the optimizers critic"),
        (
            lambda m: {"critic": m["critic"].trainable_variables, "generator": []},
            "no variables",
        ),
        (
            lambda m: {
                "critic": m["critic"].trainable_variables,
                "generator": m["critic"].trainable_variables,
            },
            "to both",
        ),
        (
            lambda m: {"critic": m["critic"].trainable_variables, "generator": [tf.Variable(1.0)]},
            "not a trainable variable",
        ),
    ],
    ids=["missing_optimizer", "empty", "shared", "foreign"],
)
def test_a_wrong_assignment_of_variables_is_one_clear_error(variables, message):
    models = {"generator": dense("generator"), "critic": dense("critic")}
    with pytest.raises(RunError, match=message):
        state_of(named_config(), models, variables(models))


def test_returned_scalars_are_shares_summed_over_replicas():
    """What the host loop does with a step's scalars: N shares of the mean add up to it."""
    values = np.arange(8, dtype=np.float32)
    two = strategy.local(2).strategy
    with two.scope():
        state = state_of(named_config())

    def share(x):
        return state.step_of(0, 8, rows=4).mean(x)

    batches = two.experimental_distribute_values_from_function(
        lambda ctx: values[ctx.replica_id_in_sync_group * 4 :][:4]
    )
    total = tf.function(
        lambda b: two.reduce(tf.distribute.ReduceOp.SUM, two.run(share, args=(b,)), axis=None)
    )(batches)
    assert float(total) == pytest.approx(values.mean())
