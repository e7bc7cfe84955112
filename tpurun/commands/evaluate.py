"""`tpurun eval`: one checkpoint on one split, or every new one (--continuous)."""

from __future__ import annotations

from absl import logging

from tpurun import storage
from tpurun.actions.evaluation import ReportEval
from tpurun.cluster import Cluster
from tpurun.commands.model_dir import chosen_checkpoint
from tpurun.commands.running import Prepared
from tpurun.errors import UsageError
from tpurun.foreign import outside
from tpurun.run_config import (
    RunConfig,
    splits,
)
from tpurun.runners import sidecar
from tpurun.runners.evaluate import Evaluator
from tpurun.storage import best
from tpurun.storage.eval_results import summary_line, write_json


def evaluate(run: RunConfig, prepared: Prepared) -> None:
    cluster, model = prepared.replicas, prepared.model
    if run.continuous and cluster.num_workers > 1:
        # The workers would each watch model_dir and could pick different checkpoints.
        raise UsageError(
            "tpurun eval --continuous runs on one machine: unset TF_CONFIG (it describes "
            f"{cluster.num_workers} workers) and run it once"
        )
    model_splits = splits.resolve(type(model), run.config)
    split = model_splits.chosen
    evaluator = Evaluator(run, cluster, model)
    best.check_metric(run, evaluator.metrics)
    report = ReportEval(run, cluster.is_chief, model_splits)
    if run.continuous:
        line = sidecar.evaluate_continuously(
            run,
            lambda path: evaluator.evaluate(path, split),
            lambda path, results: report(path, split, results),
            model_splits,
        )
        print(line, flush=True)
        return
    path = chosen_checkpoint(run)
    if isinstance(path, outside.Outside):
        evaluate_outside(run, cluster, split, path, evaluator.evaluate(path, split))
        return
    if run.best:
        evaluate_best(run, cluster, split, evaluator.evaluate(path, split))
        return
    report(path, split, evaluator.evaluate(path, split))


def evaluate_best(run: RunConfig, cluster: Cluster, split: str, results: dict[str, float]) -> None:
    """`eval --best`: the results are recorded beside the best (best/results-<split>.json).

    The best is a copy kept apart from model_dir's checkpoints, and its evaluation
    cannot improve it: neither eval/<split>/ nor best.json is touched.
    """
    if cluster.is_chief:
        logging.info("Wrote %s.", write_json(best.results_path(run.model_dir, split), results))
    print(summary_line(results, split) + " (the best checkpoint)", flush=True)


def evaluate_outside(
    run: RunConfig,
    cluster: Cluster,
    split: str,
    checkpoint: outside.Outside,
    results: dict[str, float],
) -> None:
    """`eval --checkpoint=PATH`: the results are recorded apart (outside/<name>/), never
    among model_dir's own steps' (eval/<split>/) nor offered to best/."""
    if cluster.is_chief:
        path = outside.results_path(run.model_dir, checkpoint, split)
        storage.make_dir(run.model_dir, path.rpartition("/")[0])
        logging.info("Wrote %s.", write_json(path, results))
    print(f"{summary_line(results, split)} ({checkpoint.source.prefix})", flush=True)
