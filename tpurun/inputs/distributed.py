"""A model's input_fn, called once per input pipeline, fed to the replicas (`distribute`).

Training batches must already be static; eval and predict batches are made static by
`tpurun.inputs.padding`. On logical CPU devices one host iterator feeds every replica
(`HostDistributedDataset`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import tf_internals
from tpurun.errors import RunError
from tpurun.inputs.arrays import seekable_batches, train_arrays
from tpurun.inputs.padding import check_static_batch, pad_batches
from tpurun.model import InputParams, Mode, Model, TrainArrays


def input_params(
    ctx: tf.distribute.InputContext,
    global_batch: int,
    seed: int,
    start_step: int = 0,
    micro_batches: int = 1,
    split: str | None = None,
) -> InputParams:
    """What `input_fn` is told; `micro_batches` per step with gradient accumulation, the
    split to read in EVAL."""
    return InputParams(
        batch_size=ctx.get_per_replica_batch_size(global_batch),
        global_batch_size=global_batch,
        num_replicas=ctx.num_replicas_in_sync,
        input_pipeline_id=ctx.input_pipeline_id,
        num_input_pipelines=ctx.num_input_pipelines,
        seed=seed,
        # Every step takes `micro_batches` batches per replica, dealt over the pipelines.
        start_batch=start_step
        * micro_batches
        * ctx.num_replicas_in_sync
        // ctx.num_input_pipelines,
        split=split,
    )


def train_dataset(
    model: Model, params: InputParams, arrays: TrainArrays | None = None
) -> tf.data.Dataset:
    """The TRAIN dataset of one input pipeline: `input_fn(TRAIN)`, or for a model with
    `train_arrays` (given, or asked for), their batches through `seekable_batches`."""
    arrays = arrays or train_arrays(model)
    if arrays is None:
        return model.input_fn(Mode.TRAIN, params)
    return seekable_batches(arrays, params)


def distribute(
    strategy: tf.distribute.Strategy,
    model: Model,
    mode: Mode,
    global_batch: int,
    seed: int,
    exact_pass: bool = True,
    start_step: int = 0,
    micro_batches: int = 1,
    split: str | None = None,
    arrays: TrainArrays | None = None,
) -> tf.distribute.DistributedDataset | HostDistributedDataset:
    """The model's dataset for `mode`, distributed over the strategy's replicas.

    TRAIN elements are `(features, labels)`; EVAL elements `(features, labels, mask)`;
    PREDICT elements `(features, mask)`. Iterate it and call `next()` (in or out of
    a tf.function) for the step's per-replica values; TRAIN on logical CPU devices
    gives a HostDistributedDataset, which offers only that. TRAIN resumed at
    `start_step` continues the stream exactly where that step left it. With
    `micro_batches` > 1 (gradient accumulation) a TRAIN element stacks that many
    consecutive batches, [micro_batches, batch, ...]: one optimizer step's worth.
    EVAL reads `split` (one of the model's eval_splits), given to input_fn as
    `params.split`.
    `arrays`: the model's TrainArrays when already read (else asked for).
    """
    if mode is Mode.TRAIN:
        arrays = arrays or train_arrays(model)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        train = mode is Mode.TRAIN
        params = input_params(
            ctx,
            global_batch,
            seed,
            start_step if train else 0,
            micro_batches if train else 1,
            split if mode is Mode.EVAL else None,
        )
        if train:
            return train_batches(model, params, arrays, micro_batches)
        dataset = _dataset(model.input_fn(mode, params), model, mode)
        if exact_pass and dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise RunError(
                f"{type(model).__name__}.input_fn({mode.value}) repeats forever; drop .repeat() "
                "for one exact pass, or bound it with --eval_steps"
            )
        replicas_here = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        return pad_batches(dataset, params.batch_size, replicas_here)

    return place(strategy, dataset_fn, train=mode is Mode.TRAIN)


def place(
    strategy: tf.distribute.Strategy,
    dataset_fn: Any,
    train: bool,
) -> tf.distribute.DistributedDataset | HostDistributedDataset:
    """The datasets `dataset_fn` makes per input pipeline, fed to the strategy's replicas
    (TRAIN on logical CPU devices: one host iterator for all, `HostDistributedDataset`)."""
    if train and replicas_share_host_memory(strategy):
        return HostDistributedDataset(strategy, dataset_fn)
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def train_batches(
    model: Model, params: InputParams, arrays: TrainArrays | None, micro_batches: int
) -> tf.data.Dataset:
    """One input pipeline's TRAIN batches: checked static, started at `params.start_batch`
    (skipping to it unless input_fn seeks), `micro_batches` stacked per element."""
    dataset = _dataset(train_dataset(model, params, arrays), model, Mode.TRAIN)
    check_static_batch(dataset, params.batch_size, type(model).__name__)
    if params.start_batch and not (model.input_fn_seeks or arrays):
        logging.info(
            "Skipping %d batches to continue the input where the resumed step left it (reads them: "
            "set input_fn_seeks on %s to start there directly).",
            params.start_batch,
            type(model).__name__,
        )
        dataset = dataset.skip(params.start_batch)
    if micro_batches > 1:
        dataset = dataset.batch(micro_batches, drop_remainder=True)
    if tf_internals.op_determinism_enabled():  # config.train.deterministic
        # What op determinism makes of every pipeline anyway (a map's deterministic=False
        # is overridden, stateful maps run serially), said where the training input is
        # made: the stream a resume continues.
        options = tf.data.Options()
        options.deterministic = True
        dataset = dataset.with_options(options)
    return dataset


def _dataset(dataset: Any, model: Model, mode: Mode) -> tf.data.Dataset:
    """What input_fn returned, if it is a tf.data.Dataset; else RunError."""
    if not isinstance(dataset, tf.data.Dataset):
        raise RunError(
            f"{type(model).__name__}.input_fn({mode.value}) returned "
            f"{type(dataset).__name__}; return a tf.data.Dataset"
        )
    return dataset


def replicas_share_host_memory(strategy: tf.distribute.Strategy) -> bool:
    """True for a MirroredStrategy over logical devices of this host's CPU (`--num_shards` locally)."""
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return False
    devices = strategy.extended.worker_devices
    return len(devices) > 1 and all(
        tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices
    )


class HostDistributedDataset:
    """Training input for replicas on logical CPU devices: one host iterator feeds them all.

    `distribute_datasets_from_function` feeds each replica through a
    MultiDeviceIterator: a cross-device get_next per replica per step, about
    140 us each on a 2-core machine, which was more than half of an 8-replica
    Iris step. Prefetching to a device buys nothing when every device is the
    host's own memory, so here one iterator yields the batches of all replicas
    stacked, and the step splits them in-graph (1 op per tensor).

    What each replica gets is unchanged: the dataset is built with the context
    the strategy would give (one input pipeline, the per-replica batch size), and
    replica i gets batch i of every `num_replicas` consecutive batches, as the
    MultiDeviceIterator deals them. Only TRAIN: its batches are static and endless,
    so no replica ever runs short (eval/predict need get_next_as_optional).
    """

    def __init__(self, strategy: tf.distribute.Strategy, dataset_fn: Any):
        self._strategy = strategy
        replicas = strategy.num_replicas_in_sync
        ctx = tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas
        )
        stacked = dataset_fn(ctx).batch(replicas, drop_remainder=True)
        self._dataset = stacked.prefetch(tf.data.AUTOTUNE)

    def __iter__(self) -> HostDistributedIterator:
        return HostDistributedIterator(self._strategy, iter(self._dataset))


class HostDistributedIterator:
    """`next()` gives what a DistributedIterator would: the step's PerReplica batches."""

    def __init__(self, strategy: tf.distribute.Strategy, iterator: Any):
        self._strategy = strategy
        self._iterator = iterator

    def __iter__(self) -> HostDistributedIterator:
        return self

    def __next__(self) -> Any:
        return self.get_next()

    def get_next(self) -> Any:
        stacked = next(self._iterator)
        # Unstacked once on the host; replica i then just takes its i-th pieces.
        pieces = [tf.unstack(t) for t in tf.nest.flatten(stacked)]
        return self._strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.nest.pack_sequence_as(
                stacked, [p[ctx.replica_id_in_sync_group] for p in pieces]
            )
        )


def gather_replicas(strategy: tf.distribute.Strategy, per_replica: Any) -> Any:
    """Concatenates per-replica values along the batch, in replica order (= input order)."""
    local = strategy.experimental_local_results(per_replica)
    if len(local) == 1:
        return local[0]
    return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *local)
