"""Distributed input: a model's input_fn, called once per input pipeline, fed to the replicas.

Training batches must already be static. Eval and predict batches are made
static here: the last partial batch is padded (by repeating real rows, so no
model sees zeros it might take a log of), a 0/1 mask marks the real rows, and
whole padding batches are added so every replica gets a batch on every step.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import tf_internals
from tpurun.errors import RunError
from tpurun.inputs.example_order import ExampleOrder
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


def train_arrays(model: Model) -> TrainArrays | None:
    """The model's `train_arrays()`, checked; None when it trains from input_fn(TRAIN)."""
    arrays = model.train_arrays()
    if arrays is None:
        return None
    name = type(model).__name__
    if not isinstance(arrays, TrainArrays):
        raise RunError(
            f"{name}.train_arrays() returned {type(arrays).__name__}; return "
            "tpurun.model.TrainArrays((features, labels)), or None to train from input_fn"
        )
    # From the specs: declared arrays are not built to be checked.
    leaves = tf.nest.flatten(arrays.specs)
    shapes = [tuple(leaf.shape.as_list()) for leaf in leaves]
    if not leaves or any(len(shape) == 0 for shape in shapes):
        raise RunError(
            f"{name}.train_arrays(): every array needs a first dimension (got shapes "
            f"{shapes}); give numpy arrays with one row per example"
        )
    if arrays.batch is None:
        if not (isinstance(arrays.specs, tuple) and len(arrays.specs) == 2):
            raise RunError(
                f"{name}.train_arrays(): the arrays must be a (features, labels) pair, or give "
                "TrainArrays a batch function that makes that pair from them"
            )
        if len({shape[0] for shape in shapes}) > 1:
            raise RunError(
                f"{name}.train_arrays(): the arrays have different numbers of rows "
                f"({sorted({shape[0] for shape in shapes})}); each row is one example"
            )
    if arrays.num_examples < 1:
        raise RunError(f"{name}.train_arrays(): no examples; give at least one row")
    return arrays


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
        dataset = train_dataset(model, params, arrays) if train else model.input_fn(mode, params)
        if not isinstance(dataset, tf.data.Dataset):
            raise RunError(
                f"{type(model).__name__}.input_fn({mode.value}) returned "
                f"{type(dataset).__name__}; return a tf.data.Dataset"
            )
        if train:
            check_static_batch(dataset, params.batch_size, type(model).__name__)
            if params.start_batch and not (model.input_fn_seeks or arrays):
                logging.info(
                    "Skipping %d batches to continue the input where step %d left it (reads "
                    "them: set input_fn_seeks on %s to start there directly).",
                    params.start_batch,
                    start_step,
                    type(model).__name__,
                )
                dataset = dataset.skip(params.start_batch)
            if micro_batches > 1:
                dataset = dataset.batch(micro_batches, drop_remainder=True)
            if tf_internals.op_determinism_enabled():  # config.train.deterministic
                # What op determinism makes of every pipeline anyway (a map's
                # deterministic=False is overridden, stateful maps run serially), said
                # where the training input is made: the stream a resume continues.
                options = tf.data.Options()
                options.deterministic = True
                dataset = dataset.with_options(options)
            return dataset
        if exact_pass and dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise RunError(
                f"{type(model).__name__}.input_fn({mode.value}) repeats forever; drop .repeat() "
                "for one exact pass, or bound it with --eval_steps"
            )
        replicas_here = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        return pad_batches(dataset, params.batch_size, replicas_here)

    if mode is Mode.TRAIN and replicas_share_host_memory(strategy):
        return HostDistributedDataset(strategy, dataset_fn)
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


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


BATCHES_PER_CALL = 16  # seekable_batches: batches made by one map call


def seekable_batches(tensors: Any, params: InputParams) -> tf.data.Dataset:
    """Endless TRAIN batches of in-memory examples, reshuffled every epoch, starting anywhere.

    `tensors` is a structure of arrays with one row per example (what
    from_tensor_slices takes), or a TrainArrays. The stream is a pure function of
    (params.seed, position), the order of `tpurun.inputs.example_order`: batch k of this
    input pipeline holds the examples at positions [k*B, (k+1)*B) of its shard of
    an endless sequence of epochs, each epoch a permutation of all examples by
    index_shuffle keyed by (seed, epoch). Starting at `params.start_batch` is
    therefore arithmetic, not a replay: a run resumed at step 10,000 starts as fast
    as one at step 10. Pipelines take every num_input_pipelines-th position, so
    they share the epochs without overlap. The same order as the batches a
    replica gathers itself from device data (`tpurun.inputs.device_data`).
    """
    examples = tensors if isinstance(tensors, TrainArrays) else TrainArrays(tensors)
    arrays = tf.nest.map_structure(tf.convert_to_tensor, examples.arrays)
    if examples.num_examples == 0:
        raise RunError("seekable_batches: no examples (the arrays have no rows)")
    order = ExampleOrder(examples.num_examples, params.seed)
    table = None if order.table is None else tf.constant(order.table)
    batch = params.batch_size
    pipelines, pipeline = params.num_input_pipelines, params.input_pipeline_id

    def batches_at(first: tf.Tensor) -> Any:
        """BATCHES_PER_CALL consecutive batches from batch `first`, as [n, batch, ...]."""
        rows = order.batch_rows(first, BATCHES_PER_CALL, batch, pipelines, pipeline, table)
        return examples.examples(arrays, rows)

    # Several batches per map call, then unbatched: a call costs more than the
    # rows it gathers when batches are small (8 replicas of 4 Iris rows).
    skip = params.start_batch % BATCHES_PER_CALL
    firsts = tf.data.Dataset.range(params.start_batch - skip, tf.int64.max, BATCHES_PER_CALL)
    dataset = firsts.map(batches_at, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return dataset.skip(skip).prefetch(tf.data.AUTOTUNE)


def check_static_batch(dataset: tf.data.Dataset, batch_size: int, model_name: str) -> None:
    for spec in tf.nest.flatten(dataset.element_spec):
        if spec.shape.rank is None or spec.shape.rank == 0 or spec.shape[0] != batch_size:
            raise RunError(
                f"{model_name}.input_fn(train) yields batches of shape {spec.shape}; a TPU needs "
                f"the static per-replica batch {batch_size}: batch with "
                "dataset.batch(params.batch_size, drop_remainder=True)"
            )


def pad_batches(dataset: tf.data.Dataset, batch_size: int, replicas: int) -> tf.data.Dataset:
    """Pads every batch to `batch_size` rows and appends a mask; groups batches by replica.

    A batch of more rows is refused (padding would cut it): when its static size says
    so, here; else as the batch is read.
    """
    fix = "batch it with params.batch_size (the per-replica batch), not params.global_batch_size"
    leaves = tf.nest.flatten(dataset.element_spec)
    for spec in leaves:
        if spec.shape.rank and spec.shape[0] is not None and spec.shape[0] > batch_size:
            raise RunError(
                f"the input yields batches of {spec.shape[0]} rows, more than the {batch_size} "
                f"of a replica: {fix}"
            )
    static_rows = leaves[0].shape[0] if leaves[0].shape.rank else None  # what pad_one reads
    # As the batch is read (no static size): the text of TensorFlow's error. Not asked of
    # every batch when the static size says it fits.
    too_large = (
        f"the input yields a batch of {{}} rows, more than the {batch_size} of a replica: {fix}"
    )

    def pad_one(*element: Any) -> tuple[Any, ...]:
        real = tf.shape(tf.nest.flatten(element)[0])[0]
        checks = []
        if static_rows is None:
            checks = [tf.debugging.Assert(real <= batch_size, [tf.strings.format(too_large, real)])]
        with tf.control_dependencies(checks):
            rows, mask = _padding(real, batch_size)
        padded = tf.nest.map_structure(lambda t: _take_rows(t, rows, batch_size), element)
        return (*padded, mask)

    dataset = dataset.map(pad_one, num_parallel_calls=tf.data.AUTOTUNE)
    if replicas > 1:
        # Steps consume `replicas` batches at once; the last step may find fewer, so
        # top it up with copies of a real batch whose mask is all zeros.
        def pad_group(*group: Any) -> tuple[Any, ...]:
            *tensors, mask = group
            rows, real_batches = _padding(tf.shape(mask)[0], replicas)
            padded = tf.nest.map_structure(lambda t: _take_rows(t, rows, replicas), tuple(tensors))
            return (*padded, _take_rows(mask, rows, replicas) * real_batches[:, None])

        dataset = dataset.batch(replicas).map(pad_group).unbatch()
    return dataset.prefetch(tf.data.AUTOTUNE)


def _padding(real: tf.Tensor, size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The rows that fill `real` rows up to `size` (0..real-1, then row 0 again), and the
    float32 mask of the real ones. Made once for every tensor of an element: a map's trace
    costs by its ops, and an eval or predict traces these maps at every pass."""
    positions = tf.range(size)
    is_real = positions < real
    return tf.where(is_real, positions, 0), tf.cast(is_real, tf.float32)


def _take_rows(tensor: tf.Tensor, rows: tf.Tensor, size: int) -> tf.Tensor:
    """`tensor`'s `rows` (from `_padding`), with the static size `size` in dimension 0."""
    padded = tf.gather(tensor, rows)
    padded.set_shape([size, *tensor.shape[1:]])
    return padded


def gather_replicas(strategy: tf.distribute.Strategy, per_replica: Any) -> Any:
    """Concatenates per-replica values along the batch, in replica order (= input order)."""
    local = strategy.experimental_local_results(per_replica)
    if len(local) == 1:
        return local[0]
    return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *local)
