"""What an evaluation reports: the model's metrics plus the mean loss, and their bookkeeping.

The Evaluator computes them (`tpurun.runners.evaluate.eval_metrics`); the eval actions
write and print them, and the best checkpoint compares one of them.
"""

from __future__ import annotations

import json

import tensorflow as tf

from tpurun import storage
from tpurun.layout import names
from tpurun.run_config import splits

# Eval results that are counts, not a measure of the model.
NOT_METRICS = ("num_examples", "global_step")


def metric_names(results: dict[str, float]) -> list[str]:
    """The measures of the model among eval results (not the counts)."""
    return [name for name in results if name not in NOT_METRICS]


def summary_line(results: dict[str, float], split: str) -> str:
    """`eval at step N on test: accuracy=0.9667  loss=0.0535  (30 examples)`."""
    metrics = "  ".join(f"{k}={results[k]:.4f}" for k in metric_names(results))
    return (
        f"eval at step {results['global_step']} on {split}: {metrics}  "
        f"({results['num_examples']} examples)"
    )


def results_dir(model_dir: str, split: str) -> str:
    """eval/<split>; the default split (a model that declares none) keeps the old eval/."""
    return names.eval_results_dir(model_dir, split)


def results_path(model_dir: str, step: int, split: str) -> str:
    return names.eval_results_path(model_dir, step, split)


def evaluated_before(model_dir: str, step: int, split: str, best_split: str) -> str | None:
    """The results file of this step and split if there is one, else None.

    A model_dir of the old layout has eval/results-<step>.json only: those are the
    results of the one split that chose best/ then, read as the selecting split's.
    """
    paths = [results_path(model_dir, step, split)]
    if split == best_split and split != splits.LEGACY:  # (LEGACY's path is the first)
        paths.append(results_path(model_dir, step, splits.LEGACY))
    return next((path for path in paths if tf.io.gfile.exists(path)), None)


def write_results(model_dir: str, results: dict[str, float], split: str) -> str:
    """Writes eval/<split>/results-<step>.json under model_dir, atomically; returns its path."""
    storage.make_dir(model_dir, results_dir(model_dir, split))
    return write_json(results_path(model_dir, int(results["global_step"]), split), results)


def write_json(path: str, results: dict[str, float]) -> str:
    """Writes results to `path` atomically (e.g. best/results-<split>.json); returns it."""
    storage.write_atomically(path, json.dumps(results, indent=2, sort_keys=True) + "\n")
    return path
