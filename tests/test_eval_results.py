"""tpurun.storage.eval_results: what every evaluation reports, and the files and line it makes."""

from __future__ import annotations

import json

import keras
import pytest

from tpurun.errors import RunError
from tpurun.model import Model
from tpurun.runners.evaluate import eval_metrics
from tpurun.storage.eval_results import (
    NOT_METRICS,
    evaluated_before,
    metric_names,
    results_path,
    summary_line,
    write_results,
)

RESULTS = {"accuracy": 0.96666, "loss": 0.05349, "num_examples": 30, "global_step": 1000}


def test_summary_line():
    assert (
        summary_line(RESULTS, "test")
        == "eval at step 1000 on test: accuracy=0.9667  loss=0.0535  (30 examples)"
    )


def test_metric_names_are_the_measures_not_the_counts():
    assert metric_names(RESULTS) == ["accuracy", "loss"]
    assert set(NOT_METRICS) == {"num_examples", "global_step"}


class WithMetrics(Model):
    """A model whose metrics() is given; nothing else of it is used."""

    def __init__(self, metrics):
        super().__init__(None)
        self._metrics = metrics

    def metrics(self):
        return dict(self._metrics)

    def input_fn(self, mode, params):
        raise NotImplementedError

    def build(self):
        raise NotImplementedError

    def loss(self, labels, outputs):
        raise NotImplementedError


def test_eval_metrics_are_the_models_plus_the_mean_loss():
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    metrics = eval_metrics(WithMetrics({"accuracy": accuracy}))
    assert list(metrics) == ["accuracy", "loss"]
    assert metrics["accuracy"] is accuracy and isinstance(metrics["loss"], keras.metrics.Mean)


@pytest.mark.parametrize("reserved", ["loss", "num_examples", "global_step"])
def test_a_model_may_not_name_a_metric_like_what_the_launcher_reports(reserved):
    with pytest.raises(RunError) as raised:
        eval_metrics(WithMetrics({reserved: keras.metrics.Mean()}))
    assert str(raised.value) == f"WithMetrics.metrics() may not name a metric {reserved!r}"


def test_write_results_writes_eval_split_results_step_json(tmp_path):
    path = write_results(str(tmp_path), RESULTS, "test")
    expected = tmp_path / "eval" / "test" / "results-1000.json"
    assert path == results_path(str(tmp_path), 1000, "test") == str(expected)
    assert json.loads(expected.read_text()) == RESULTS
    assert [p.name for p in (tmp_path / "eval").iterdir()] == ["test"]


def test_the_default_split_of_a_model_that_declares_none_keeps_the_old_layout(tmp_path):
    path = write_results(str(tmp_path), RESULTS, "eval")
    assert path == str(tmp_path / "eval" / "results-1000.json")


def test_old_layout_results_count_for_the_selecting_split_only(tmp_path):
    write_results(str(tmp_path), RESULTS, "eval")  # eval/results-1000.json
    old = str(tmp_path / "eval" / "results-1000.json")
    assert evaluated_before(str(tmp_path), 1000, "val", best_split="val") == old
    assert evaluated_before(str(tmp_path), 1000, "test", best_split="val") is None
    new = write_results(str(tmp_path), RESULTS, "test")
    assert evaluated_before(str(tmp_path), 1000, "test", best_split="val") == new
