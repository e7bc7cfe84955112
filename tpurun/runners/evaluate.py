"""The eval runner: one exact pass over the eval data, padding masked out of every metric."""

from __future__ import annotations

import time

import keras
import tensorflow as tf
from absl import logging

from tpurun import inputs
from tpurun.cluster import Cluster, replica_sum
from tpurun.errors import RunError
from tpurun.model import Mode, Model, build_models
from tpurun.run_config import RunConfig
from tpurun.runners import restore
from tpurun.storage.eval_results import NOT_METRICS
from tpurun.training_step.state import unique


def eval_metrics(model: Model) -> dict[str, keras.metrics.Metric]:
    """The model's metrics plus the mean loss: what every evaluation reports."""
    metrics = dict(model.metrics())
    for reserved in ("loss", *NOT_METRICS):
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
            self.models = build_models(model)
            self.keras_model = self.models[model.serving_model]
            self._averages = restore.averages_of(model, self.models, run.config)
        self.metrics = eval_metrics(model)
        self.num_examples = keras.metrics.Sum()
        self._loop = tf.function(self._host_loop)
        # A cross-worker all-reduce of nothing: returns once every worker called it.
        self._barrier = tf.function(lambda: replica_sum(self.strategy, tf.constant([1])))

    @property
    def weights(self) -> list:
        """Every variable of every model (non-trainable ones too)."""
        return unique([v for m in self.models.values() for v in m.variables])

    def replica_step(self, features, labels, mask):
        """One replica's eval step (the model's `eval_step`): what the host-side metrics need
        of its padded batch."""
        labels, outputs, loss = self.model.eval_step(self.models, features, labels)
        return labels, outputs, mask, loss

    def _host_loop(self, iterator, max_steps: tf.Tensor) -> tf.Tensor:
        """Runs up to max_steps eval steps; returns how many ran (fewer at the end of data)."""
        steps = tf.constant(0)
        for _ in tf.range(max_steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            per_replica = self.strategy.run(self.replica_step, args=batch.get_value())
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

    def evaluate(self, checkpoint_path: restore.Chosen, split: str) -> dict[str, float]:
        """The checkpoint's metrics over one exact pass (or --eval_steps) of `split`."""
        if self.num_workers > 1:
            # Every worker reads the chief's files: in train --eval_every the others
            # may finish their part of the save before the chief has written its.
            self._barrier()
        restore.restore_weights(
            self.models, checkpoint_path, self._averages, self.model.serving_model
        )
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
            split=split,
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
            raise RunError(
                f"{type(self.model).__name__}.input_fn(eval) yielded no examples of split {split!r}"
            )
        results = {name: float(metric.result()) for name, metric in self.metrics.items()}
        results["num_examples"] = count
        results["global_step"] = restore.step_of(checkpoint_path)
        logging.info(
            "Evaluated %d examples of %s in %d steps (%.2fs).",
            count,
            split,
            steps,
            time.perf_counter() - start,
        )
        return results
