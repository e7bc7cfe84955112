"""tpurun.runners.evaluate: the Evaluator's one exact pass, padding masked out of every metric.

Iris's 30 test rows in batches that do not divide them, on 1 and 2 replicas: every
count and metric is the one computed directly on the 30 rows.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf
from iris_runs import iris_checkpoint, iris_run, restored_iris
from tpurun.models import iris

from tpurun.cluster import strategy
from tpurun.errors import RunError
from tpurun.model import Mode, create
from tpurun.runners.evaluate import Evaluator


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return iris_checkpoint(tmp_path_factory.mktemp("iris"))


@pytest.fixture(scope="module")
def direct(checkpoint) -> dict[str, float]:
    """Accuracy and mean loss of the checkpoint's model on all 30 rows at once."""
    test = iris.read_csv(iris.shipped_csv("iris_test.csv"), with_labels=True)
    features = {name: tf.constant(test[name].to_numpy()) for name in iris.FEATURES}
    labels = test[iris.LABEL].to_numpy()
    logits = restored_iris(checkpoint)(features, training=False).numpy()
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    correct = np.float32(np.sum(logits.argmax(axis=1) == labels))
    return {"accuracy": float(correct / np.float32(30)), "loss": float(np.mean(loss))}


@functools.cache
def evaluator(replicas: int, **flags) -> Evaluator:
    """One Evaluator per setting for the whole module: its compiled loop is reused."""
    run = iris_run("/unused", "eval", **flags)
    return Evaluator(run, strategy.local(replicas), create(run.config))


def evaluate(checkpoint: str, replicas: int, **flags) -> dict[str, float]:
    return evaluator(replicas, **flags).evaluate(checkpoint, "test")


@pytest.mark.parametrize(
    "replicas, batch",
    [
        (1, 8),  # batches of 8: the last one 6 rows and 2 of padding
        (1, 32),  # one batch larger than the 30 rows
        (2, 12),  # 6 rows a replica: in the last batch, a replica of padding only
    ],
    ids=["batch8-1", "batch32-1", "batch12-2"],
)
def test_one_exact_pass_whatever_the_batch_and_replicas(checkpoint, direct, replicas, batch):
    results = evaluate(checkpoint, replicas, eval_batch_size=batch)
    assert results["num_examples"] == 30
    assert results["global_step"] == 7
    assert results["accuracy"] == direct["accuracy"]
    assert results["loss"] == pytest.approx(direct["loss"], rel=1e-6)
    assert set(results) == {"accuracy", "loss", "num_examples", "global_step"}


def test_1_and_2_replicas_give_the_same_metrics(checkpoint):
    one, two = (evaluate(checkpoint, r, eval_batch_size=12) for r in (1, 2))
    assert one["num_examples"] == two["num_examples"] == 30
    assert one["accuracy"] == two["accuracy"]
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-6)


@pytest.mark.parametrize(
    "replicas, batch, steps, examples",
    [
        (2, 12, 2, 24),  # 2 steps of the global batch of 12, not of a replica's 6 rows
        (1, 8, 100, 30),  # the data end first
    ],
)
def test_eval_steps_bounds_the_batches(checkpoint, replicas, batch, steps, examples):
    """--eval_steps=N: N steps of the global eval batch (fewer if the data end first)."""
    results = evaluate(checkpoint, replicas, eval_batch_size=batch, eval_steps=steps)
    assert results["num_examples"] == examples


def test_a_second_evaluation_starts_from_zero(checkpoint):
    first, second = (evaluate(checkpoint, 1, eval_batch_size=8) for _ in range(2))
    assert first == second and second["num_examples"] == 30


class Reshaped(iris.Iris):
    """Iris whose eval input is changed by `change(dataset)`."""

    change = staticmethod(lambda dataset: dataset)

    def input_fn(self, mode, params):
        if mode is Mode.EVAL:
            assert params.split == "test"  # Iris's one split, as the Evaluator was asked
        dataset = super().input_fn(mode, params)
        return self.change(dataset) if mode is Mode.EVAL else dataset


def test_an_eval_input_without_rows_is_an_error(checkpoint):
    run = iris_run("/unused", "eval")
    model = Reshaped(run.config)
    model.change = lambda dataset: dataset.take(0)
    with pytest.raises(
        RunError, match=r"^Reshaped.input_fn\(eval\) yielded no examples of split 'test'$"
    ):
        Evaluator(run, strategy.local(1), model).evaluate(checkpoint, "test")


def test_an_endless_eval_input_needs_eval_steps(checkpoint):
    model = Reshaped(iris_run("/unused").config)
    model.change = lambda dataset: dataset.repeat()
    run = iris_run("/unused", "eval")
    with pytest.raises(RunError, match=r"repeats forever; drop .repeat\(\) .* --eval_steps"):
        Evaluator(run, strategy.local(1), model).evaluate(checkpoint, "test")
    bounded = iris_run("/unused", "eval", eval_batch_size=8, eval_steps=5)
    # Batches of 8, 8, 8, 6 (the end of the 30 rows), 8 (the repeat's first).
    assert (
        Evaluator(bounded, strategy.local(1), model).evaluate(checkpoint, "test")["num_examples"]
        == 38
    )
