"""A run's training input through a tf.data service: the model's input_fn, distributed by tpurun.

The model's `input_fn(TRAIN)` is unchanged. It is built once per input pipeline as
one pipeline would build it - `num_input_pipelines=1`, `input_pipeline_id=0`, at the
per-replica batch - so that every host registers the same dataset with the dispatcher
and reads from one job, whose elements each go to one reader (the service, not the
hosts, splits the work: `processing_mode`). Before it is registered, its graph is
checked for Python (`pipeline`), and it is told where to start (`job.plan`: a
resumed run's epoch, or its stream's start). Then `tf.data.experimental.service.
distribute` moves it to the service under the attempt's job (`job.job_name`), and
the batches come back through `tpurun.inputs.place` as any other training input.

Nothing of it is checkpointed: a data-service iterator cannot be saved (TensorFlow's
"SaveInternal is not yet supported"), and tpurun never saves an input iterator: its
checkpoints hold the model, the optimizers and the step (`tpurun.training_step.state`),
and a run without the service finds its input's place from the step alone.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import tensorflow as tf

from tpurun import datasets, inputs
from tpurun.cluster import Cluster, replica_sum
from tpurun.data_service import job, pipeline
from tpurun.data_service.watch import Watch
from tpurun.model import Model, TrainArrays
from tpurun.run_config import RunConfig
from tpurun.run_config.keys.service_keys import Service

TOKEN_BITS = 48  # the attempt's token: a sum over replicas of it stays an exact int64


class ServiceInput:
    """The training input of `run` from `step` on, through `service`."""

    def __init__(
        self,
        run: RunConfig,
        service: Service,
        cluster: Cluster,
        model: Model,
        arrays: TrainArrays | None,
        step: int,
    ):
        self.run, self.service, self.cluster, self.model = run, service, cluster, model
        self.arrays = arrays
        self.micro_batches = run.config.train.accumulate_steps
        replicas = cluster.strategy.num_replicas_in_sync
        self.resume = job.plan(
            step,
            epoch_examples(run, arrays),
            run.train_batch_size * self.micro_batches,
            run.train_batch_size // replicas,
            bool(model.input_fn_seeks or arrays),
            type(model).__name__,
        )
        self.job = job.job_name(run.model_dir, agreed_token(cluster))
        self.watch = Watch(service, run.model_dir, step)

    def line(self) -> str:
        return self.resume.line(self.service, self.job)

    def record(self) -> dict[str, Any]:
        return self.resume.record(self.service, self.job)

    def distribute(self) -> Any:
        """The distributed training batches; the watch starts before the first is asked (and
        stops again if they cannot be made: a pipeline refused). The run's `ServiceWatch`
        stops it at the run's end."""
        self.watch.start()
        try:
            return inputs.place(self.cluster.strategy, self._dataset, train=True)
        except BaseException:
            self.watch.stop()
            raise

    def _dataset(self, ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        run = self.run
        params = inputs.input_params(
            ctx, run.train_batch_size, run.seed, micro_batches=self.micro_batches
        )
        # One pipeline's dataset on every host: the same registered dataset, one job.
        params = dataclasses.replace(
            params, input_pipeline_id=0, num_input_pipelines=1, start_batch=self.resume.start_batch
        )
        dataset = inputs.train_batches(self.model, params, self.arrays, self.micro_batches)
        pipeline.refuse_python(dataset, type(self.model).__name__)
        return dataset.apply(
            tf.data.experimental.service.distribute(
                processing_mode=self.service.processing_mode,
                service=self.service.target,
                job_name=self.job,
            )
        )


def epoch_examples(run: RunConfig, arrays: TrainArrays | None) -> int | None:
    """The training examples in an epoch, where known: counted by the run, the arrays',
    a TFDS dataset's record, or config.data.train_examples."""
    if run.train_examples:
        return run.train_examples
    if arrays is not None:
        return arrays.num_examples
    counted = datasets.train_examples(run.config)
    if counted:
        return counted
    data = run.config.get("data") or {}
    given = data.get("train_examples") if hasattr(data, "get") else None
    return given if isinstance(given, int) and given > 0 else None


def agreed_token(cluster: Cluster) -> int:
    """A random token for this run attempt, the same on every worker of a cluster (the
    chief's: every other worker adds 0 to the sum over the replicas)."""
    token = secrets.randbits(TOKEN_BITS) or 1
    if cluster.num_workers == 1:
        return token
    mine = tf.constant([token if cluster.is_chief else 0], tf.int64)
    summed = tf.function(lambda values: replica_sum(cluster.strategy, values))(mine)
    per_worker = cluster.strategy.num_replicas_in_sync // cluster.num_workers
    return int(summed[0]) // per_worker
