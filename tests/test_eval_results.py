"""tpurun.eval_results: what every evaluation reports, and the files and line it makes."""

from __future__ import annotations

import json

import keras
import pytest

from tpurun.errors import RunError
from tpurun.eval_results import (
    NOT_METRICS,
    eval_metrics,
    metric_names,
    results_path,
    summary_line,
    write_results,
)
from tpurun.model import Model

RESULTS = {"accuracy": 0.96666, "loss": 0.05349, "num_examples": 30, "global_step": 1000}


def test_summary_line():
    assert summary_line(RESULTS) == "eval at step 1000: accuracy=0.9667  loss=0.0535  (30 examples)"


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


def test_write_results_writes_eval_results_step_json(tmp_path):
    path = write_results(str(tmp_path), RESULTS)
    assert path == results_path(str(tmp_path), 1000) == str(tmp_path / "eval" / "results-1000.json")
    assert json.loads((tmp_path / "eval" / "results-1000.json").read_text()) == RESULTS
    assert [p.name for p in (tmp_path / "eval").iterdir()] == ["results-1000.json"]
