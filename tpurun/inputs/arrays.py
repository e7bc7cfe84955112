"""A model's in-memory training arrays: checked (`train_arrays`), and batched from any
position of an endless, seeded stream of epochs (`seekable_batches`)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpurun.errors import RunError
from tpurun.inputs.example_order import ExampleOrder
from tpurun.model import InputParams, Model, TrainArrays


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
