"""Exact evaluation: one pass over the eval data, padding masked out of every metric."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import keras
import tensorflow as tf
from absl import logging

from tpurun import checkpoints, inputs
from tpurun.cluster import Cluster, replica_sum
from tpurun.errors import RunError
from tpurun.files import write_atomically
from tpurun.model import Mode, Model
from tpurun.run_config import RunConfig
from tpurun.train import build_model


def eval_metrics(model: Model) -> dict[str, keras.metrics.Metric]:
    """The model's metrics plus the mean loss: what every evaluation reports."""
    metrics = dict(model.metrics())
    for reserved in ("loss", "num_examples"):
        if reserved in metrics:
            raise RunError(f"{type(model).__name__}.metrics() may not name a metric {reserved!r}")
    metrics["loss"] = keras.metrics.Mean()
    return metrics


class Evaluator:
    """Runs the model's eval dataset through the replicas; metrics are updated on the host.

    Like TPUEstimator's eval_metrics, the replicas compute outputs and the metrics
    run on the host over the gathered batch, so any Keras metric works unchanged.
    """

    def __init__(self, run: RunConfig, cluster: Cluster, model: Model):
        self.run = run
        self.strategy = cluster.strategy
        self.num_workers = cluster.num_workers
        self.model = model
        with self.strategy.scope():
            self.keras_model = build_model(model)
        self.metrics = eval_metrics(model)
        self.num_examples = keras.metrics.Sum()
        self._loop = tf.function(self._host_loop)
        # A cross-worker all-reduce of nothing: returns once every worker called it.
        self._barrier = tf.function(lambda: replica_sum(self.strategy, tf.constant([1])))

    def _replica_step(self, features, labels, mask):
        outputs = self.keras_model(features, training=False)
        return labels, outputs, mask, self.model.loss(labels, outputs)

    def _host_loop(self, iterator, max_steps: tf.Tensor) -> tf.Tensor:
        """Runs up to max_steps eval steps; returns how many ran (fewer at the end of data)."""
        steps = tf.constant(0)
        for _ in tf.range(max_steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            per_replica = self.strategy.run(self._replica_step, args=batch.get_value())
            labels, outputs, mask, loss = inputs.gather_replicas(self.strategy, per_replica)
            for name, metric in self.metrics.items():
                if name == "loss":
                    metric.update_state(loss, sample_weight=mask)
                else:
                    metric.update_state(labels, outputs, sample_weight=mask)
            self.num_examples.update_state(mask)
            steps += 1
        return steps

    def _sum_across_workers(self) -> None:
        """Adds up every worker's metric state, so each reports the whole eval set.

        Each worker of a MultiWorkerMirroredStrategy evaluates its own shard with
        its own host-side metrics. Keras metrics keep additive state (totals and
        counts), so the sum over workers is the state of one pass over all shards.
        """
        variables = [v for m in (*self.metrics.values(), self.num_examples) for v in m.variables]
        local_replicas = self.strategy.num_replicas_in_sync // self.num_workers

        def all_reduce(values):
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, values
            )
            # Every local replica contributed this worker's (same) state.
            return [value / local_replicas for value in summed]

        values = [tf.cast(tf.convert_to_tensor(v), tf.float64) for v in variables]
        summed = self.strategy.experimental_local_results(
            self.strategy.run(all_reduce, args=(values,))
        )[0]
        for variable, value in zip(variables, summed, strict=True):
            variable.assign(tf.cast(value, variable.dtype))

    def evaluate(self, checkpoint_path: str) -> dict[str, float]:
        if self.num_workers > 1:
            # Every worker reads the chief's files: in train --eval_every the others
            # may finish their part of the save before the chief has written its.
            self._barrier()
        checkpoints.restore_model(self.keras_model, checkpoint_path)
        for metric in (*self.metrics.values(), self.num_examples):
            metric.reset_state()
        limit = self.run.config.eval.steps
        dataset = inputs.distribute(
            self.strategy,
            self.model,
            Mode.EVAL,
            self.run.eval_batch_size,
            self.run.seed,
            exact_pass=not limit,
        )
        iterator = iter(dataset)
        per_call = self.run.iterations
        steps, start = 0, time.perf_counter()
        while not limit or steps < limit:
            want = per_call if not limit else min(per_call, limit - steps)
            ran = int(self._loop(iterator, tf.constant(want)))
            steps += ran
            if ran < want:
                break
        if self.num_workers > 1:
            self._sum_across_workers()
        count = int(self.num_examples.result())
        if count == 0:
            raise RunError(f"{type(self.model).__name__}.input_fn(eval) yielded no examples")
        results = {name: float(metric.result()) for name, metric in self.metrics.items()}
        results["num_examples"] = count
        results["global_step"] = checkpoints.step_of(checkpoint_path)
        logging.info(
            "Evaluated %d examples in %d steps (%.2fs).", count, steps, time.perf_counter() - start
        )
        return results


def results_path(model_dir: str, step: int) -> str:
    return tf.io.gfile.join(model_dir, "eval", f"results-{step}.json")


def write_results(run: RunConfig, results: dict[str, float]) -> str:
    """Writes eval/results-<step>.json under model_dir, atomically; returns its path."""
    tf.io.gfile.makedirs(tf.io.gfile.join(run.model_dir, "eval"))
    path = results_path(run.model_dir, int(results["global_step"]))
    write_atomically(path, json.dumps(results, indent=2, sort_keys=True) + "\n")
    return path


# Eval results that are counts, not a measure of the model.
NOT_METRICS = ("num_examples", "global_step")


def summary_line(results: dict[str, float]) -> str:
    """`eval at step N: accuracy=0.9667  loss=0.0535  (30 examples)`."""
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in results.items() if k not in NOT_METRICS)
    return f"eval at step {results['global_step']}: {metrics}  ({results['num_examples']} examples)"


class EvalSummaries:
    """Every eval metric as a TensorBoard scalar under model_dir/eval, at the checkpoint's step.

    One events file per run however many checkpoints it evaluates, created at the
    first write (a failed eval leaves none) and flushed after each, so TensorBoard
    shows a sidecar's results as they come.
    """

    def __init__(self, model_dir: str):
        self._logdir = tf.io.gfile.join(model_dir, "eval")
        self._writer: tf.summary.SummaryWriter | None = None

    def write(self, results: dict[str, float]) -> None:
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self._logdir)
        with self._writer.as_default(step=int(results["global_step"])):
            for name, value in results.items():
                if name != "global_step":
                    tf.summary.scalar(name, value)
        self._writer.flush()


# --- eval --continuous: a sidecar evaluator beside a training run. ---

# How often a sidecar looks for a new checkpoint: reading the small `checkpoint`
# state file is cheap, and a second is short next to the time between saves.
POLL_SECONDS = 1.0


def saved_checkpoints(model_dir: str) -> list[str]:
    """model_dir's complete checkpoints, oldest first, as its `checkpoint` state file lists them.

    The state file, not a glob of ckpt-* files: a save rewrites it (atomically)
    only after every file of the new checkpoint is written, so what it lists was
    complete, though keep_checkpoint_max may have deleted it since.
    """
    if not tf.io.gfile.isdir(model_dir):
        return []
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None:
        return []
    paths = {*state.all_model_checkpoint_paths, state.model_checkpoint_path}
    return sorted((p for p in paths if re.search(r"ckpt-\d+$", p)), key=checkpoints.step_of)


def still_saved(path: str) -> bool:
    """Whether the checkpoint's files are all still there (keep_checkpoint_max deletes them)."""
    return tf.io.gfile.exists(path + ".index") and bool(tf.io.gfile.glob(path + ".data-*"))


def _nothing_appeared(run: RunConfig) -> RunError:
    return RunError(
        f"no checkpoint appeared in {run.model_dir} within --eval_timeout={run.eval_timeout:g}s; "
        f"start tpurun train --config={run.config_name} --model_dir={run.model_dir} "
        "(before or after the sidecar), or raise --eval_timeout"
    )


def wait_for_checkpoint(run: RunConfig) -> None:
    """Waits until model_dir has a checkpoint, up to --eval_timeout seconds; reads nothing else.

    A sidecar may start before the trainer has created model_dir; until the first
    checkpoint it writes nothing, so one that gives up leaves no trace.
    """
    deadline = time.monotonic() + run.eval_timeout
    logged = False
    while not saved_checkpoints(run.model_dir):
        if time.monotonic() >= deadline:
            raise _nothing_appeared(run)
        if not logged:
            logging.info("Waiting for a checkpoint in %s.", run.model_dir)
            logged = True
        time.sleep(POLL_SECONDS)


def evaluate_continuously(
    run: RunConfig,
    evaluate: Callable[[str], dict[str, float]],
    report: Callable[[str, dict[str, float]], None],
) -> str:
    """Evaluates every checkpoint of model_dir once, in step order, as they appear.

    Stops after the checkpoint of the final step (config train.steps), or after
    --eval_timeout seconds without a new one; returns the line saying which.
    A checkpoint with eval/results-<step>.json was evaluated already (by an
    earlier sidecar, `tpurun eval` or `train --eval_every`): an evaluation is
    exact, so doing it again would only repeat the numbers; it is skipped. One
    deleted by keep_checkpoint_max before it was read is skipped too.
    """
    final, timeout = run.train_steps, run.eval_timeout
    seen: set[int] = set()
    evaluated: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        new = [p for p in saved_checkpoints(run.model_dir) if checkpoints.step_of(p) not in seen]
        if len(new) > 1:
            logging.info(
                "%d new checkpoints (steps %s): evaluating each, in step order.",
                len(new),
                ", ".join(str(checkpoints.step_of(p)) for p in new),
            )
        for path in new:
            step = checkpoints.step_of(path)
            seen.add(step)
            results = _evaluate_once(run, path, evaluate)
            if results is not None:
                report(path, results)
                evaluated.append(step)
        if new:
            deadline = time.monotonic() + timeout
        if seen and max(seen) >= final:
            return (
                f"eval --continuous: stopped after the checkpoint of the final step {max(seen)} "
                f"(--train_steps={final}); evaluated {len(evaluated)} checkpoint(s) in this run"
            )
        if time.monotonic() >= deadline:
            if not seen:
                raise _nothing_appeared(run)
            return (
                f"eval --continuous: stopped: no new checkpoint in {run.model_dir} for "
                f"{timeout:g}s (--eval_timeout) and the final step {final} (--train_steps) is "
                f"not reached; evaluated {len(evaluated)} checkpoint(s) in this run, the newest "
                f"is step {max(seen)}"
            )
        time.sleep(POLL_SECONDS)


def _evaluate_once(
    run: RunConfig, path: str, evaluate: Callable[[str], dict[str, float]]
) -> dict[str, float] | None:
    """The checkpoint's results; None if it was evaluated before or deleted before it was read."""
    step = checkpoints.step_of(path)
    done = results_path(run.model_dir, step)
    if tf.io.gfile.exists(done):
        logging.info("Step %d was evaluated before (%s): not again.", step, done)
        return None
    deleted = f"Checkpoint {path} was deleted (keep_checkpoint_max) before it was read: skipped."
    if not still_saved(path):
        logging.warning(deleted)
        return None
    try:
        return evaluate(path)
    except checkpoints.CheckpointGone:
        # Only a failure to read the checkpoint itself: once restored, any error
        # (bad eval data, no examples) is the run's error, deleted checkpoint or not.
        if still_saved(path):
            raise
        logging.warning(deleted)
        return None
