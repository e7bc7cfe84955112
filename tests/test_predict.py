"""tpurun.runners.predict: N rows in, N rows out, in input order, the padding stripped; or `generate`."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from iris_runs import feature_columns, iris_checkpoint, iris_run, restored_iris
from tpurun.models import iris

from tpurun.cluster import strategy
from tpurun.model import create
from tpurun.runners.predict import Predictor


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return iris_checkpoint(tmp_path_factory.mktemp("iris"))


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    """A CSV of the first 7 test rows' features, and those features."""
    path = tmp_path_factory.mktemp("rows") / "rows.csv"
    test = iris.read_csv(iris.shipped_csv("iris_test.csv"), with_labels=True)
    test[list(iris.FEATURES)].iloc[:7].to_csv(path, index=False)
    return str(path), {name: test[name].to_numpy()[:7] for name in iris.FEATURES}


def predict(checkpoint: str, replicas: int, **flags) -> list[dict]:
    run = iris_run("/unused", "predict", **flags)
    return list(Predictor(run, strategy.local(replicas), create(run.config)).predict(checkpoint))


@pytest.mark.parametrize(
    "replicas, batch",
    [(1, 4), (1, 7), (1, 16), (8, 8), (8, 16)],
    ids=["1x4", "1x7_exact", "1x16_one_padded", "8x8_one_row_each", "8x16_padding_batches"],
)
def test_n_rows_in_n_rows_out_in_order(checkpoint, rows, replicas, batch):
    path, features = rows
    predictions = predict(checkpoint, replicas, input=path, predict_batch_size=batch)
    assert len(predictions) == 7
    logits = restored_iris(checkpoint)(feature_columns(features), training=False).numpy()
    np.testing.assert_allclose(
        np.stack([p["logits"] for p in predictions]), logits, rtol=1e-5, atol=1e-6
    )
    assert [int(p["class_ids"]) for p in predictions] == logits.argmax(axis=1).tolist()
    for p in predictions:
        assert set(p) == {"class_ids", "probabilities", "logits"}
        assert p["probabilities"].shape == (3,)
        assert isinstance(p["probabilities"], np.ndarray)


def test_without_input_the_models_own_examples(checkpoint):
    assert len(predict(checkpoint, 1)) == len(iris.PREDICTION_EXPECTED)


class Generating(iris.Iris):
    """Iris with a `generate` of its own: rows of what the restored model holds."""

    def generate(self, keras_model, strategy):
        kernel = keras_model.get_layer("logits").kernel.numpy()
        return [{"kernel_sum": float(kernel.sum()), "replicas": strategy.num_replicas_in_sync}]


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_model_with_generate_predicts_its_own_rows_from_the_restored_model(checkpoint, replicas):
    run = iris_run("/unused", "predict")
    (row,) = Predictor(run, strategy.local(replicas), Generating(run.config)).predict(checkpoint)
    expected = restored_iris(checkpoint).get_layer("logits").kernel.numpy().sum()
    assert row == {"kernel_sum": pytest.approx(float(expected)), "replicas": replicas}
    assert tf.distribute.get_strategy() is strategy.local(1).strategy  # left no scope open
