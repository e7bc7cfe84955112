"""Exact evaluation: one pass over the eval data, padding masked out of every metric."""

from __future__ import annotations

import json
import time

import keras
import tensorflow as tf
from absl import logging

from tpurun import checkpoints, inputs
from tpurun.cluster import Cluster
from tpurun.errors import RunError
from tpurun.model import Mode, Model
from tpurun.run_config import RunConfig
from tpurun.train import build_model


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
        self.metrics = dict(model.metrics())
        for reserved in ("loss", "num_examples"):
            if reserved in self.metrics:
                raise RunError(
                    f"{type(model).__name__}.metrics() may not name a metric {reserved!r}"
                )
        self.metrics["loss"] = keras.metrics.Mean()
        self.num_examples = keras.metrics.Sum()
        self._loop = tf.function(self._host_loop)

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


def write_results(run: RunConfig, results: dict[str, float]) -> str:
    """Writes eval/results-<step>.json under model_dir, atomically; returns its path."""
    eval_dir = tf.io.gfile.join(run.model_dir, "eval")
    tf.io.gfile.makedirs(eval_dir)
    path = tf.io.gfile.join(eval_dir, f"results-{results['global_step']}.json")
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(json.dumps(results, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return path


def write_eval_summaries(run: RunConfig, results: dict[str, float]) -> None:
    """Every eval metric as a TensorBoard scalar under model_dir/eval, at the checkpoint's step."""
    writer = tf.summary.create_file_writer(tf.io.gfile.join(run.model_dir, "eval"))
    with writer.as_default(step=int(results["global_step"])):
        for name, value in results.items():
            if name != "global_step":
                tf.summary.scalar(name, value)
    writer.close()
