"""tpurun.foreign.warm_start: a new run's weights from another run's checkpoint, by variable pattern.

On Iris checkpoints written here (the CLI runs are in test_checkpoint_options.py).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import capture_info_logs
from iris_runs import iris_checkpoint, iris_run

from tpurun.errors import UsageError
from tpurun.foreign.warm_start import warm_start
from tpurun.model import create


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A model_dir with one Iris checkpoint (seed 1); and its weights."""
    model_dir = tmp_path_factory.mktemp("source")
    path = iris_checkpoint(model_dir, step=200, seed=1)
    tf.compat.v1.train.update_checkpoint_state(str(model_dir), path)
    reader = tf.train.load_checkpoint(path)
    return model_dir, path, reader


def target(warm_start_from: str, **overrides):
    """A fresh Iris model (seed 2) and the warm start's run; (model, keras model, run)."""
    run = iris_run("/unused", warm_start_from=warm_start_from, overrides=overrides)
    keras.utils.set_random_seed(2)
    model = create(run.config)
    return model, model.build(), run


def same(a: keras.Model, b: keras.Model) -> list[bool]:
    return [
        np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a.variables, b.variables, strict=True)
    ]


@pytest.mark.parametrize("by", ["model_dir", "checkpoint"])
def test_every_weight_is_taken_from_the_newest_checkpoint_or_the_one_named(source, caplog, by):
    capture_info_logs(caplog)
    model_dir, path, _ = source
    model, keras_model, run = target(str(model_dir) if by == "model_dir" else path)
    warm_start(model, keras_model, run)
    restored = create(run.config).build()
    tf.train.Checkpoint(model=restored).read(path).expect_partial()
    assert same(keras_model, restored) == [True] * 6
    assert (
        f"Warm-started 6 of 6 variables from {path}; training starts at step 0." in caplog.messages
    )


def test_only_the_variables_matching_warm_start_vars(source):
    _, path, _ = source
    model, keras_model, run = target(path, **{"train.warm_start_vars": "logits"})
    before = [v.numpy() for v in keras_model.variables]
    warm_start(model, keras_model, run)
    restored = create(run.config).build()
    tf.train.Checkpoint(model=restored).read(path).expect_partial()
    taken = [v.path.startswith("logits/") for v in keras_model.variables]
    assert sum(taken) == 2
    assert [equal for equal, t in zip(same(keras_model, restored), taken, strict=True) if t] == [
        True,
        True,
    ]
    others = [b for b, t in zip(before, taken, strict=True) if not t]
    after = [v.numpy() for v, t in zip(keras_model.variables, taken, strict=True) if not t]
    assert all(np.array_equal(b, a) for b, a in zip(others, after, strict=True))  # kept


@pytest.mark.parametrize(
    "where, overrides, message",
    [
        ("empty_dir", {}, "is an empty directory: it holds no checkpoint"),
        ("nothing", {}, "is neither a checkpoint (a prefix such as model.ckpt-100"),
        ("checkpoint", {"train.warm_start_vars": "("}, "train.warm_start_vars='(' is not a regex"),
        ("checkpoint", {"train.warm_start_vars": "nomatch"}, "matches none of the"),
        (
            "checkpoint",
            {"hidden_units": (7,)},
            "kernel [4, 10] float32 in the checkpoint (4 mismatched; each listed above)",
        ),
        ("foreign", {}, "(6 unfilled; each listed above)"),
    ],
    ids=["no_checkpoint", "no_such_path", "bad_regex", "matches_none", "other_shape", "foreign"],
)
def test_a_warm_start_that_cannot_be_done_says_why(source, tmp_path, where, overrides, message):
    _, path, _ = source
    (tmp_path / "empty").mkdir()
    paths = {
        "empty_dir": str(tmp_path / "empty"),
        "nothing": str(tmp_path / "nothing"),
        "checkpoint": path,
        "foreign": tf.train.Checkpoint(other=tf.Variable([1.0])).write(str(tmp_path / "foreign")),
    }
    run = iris_run("/unused", warm_start_from=paths[where], overrides=overrides)
    model = create(run.config)
    keras_model = model.build()
    before = [v.numpy() for v in keras_model.variables]
    with pytest.raises(UsageError) as raised:
        warm_start(model, keras_model, run)
    assert message in str(raised.value), str(raised.value)
    assert all(
        np.array_equal(b, v.numpy()) for b, v in zip(before, keras_model.variables, strict=True)
    )
