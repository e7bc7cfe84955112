"""Whether the tf.data service's workers can run a pipeline: no Python inside it.

A worker runs the dataset's graph in another process, on another machine: the
Python functions of `tf.py_function`, `tf.numpy_function` (`tf.compat.v1.py_func`)
and `Dataset.from_generator` stay in the trainer's process, and the worker fails
on them when it first makes an element (or, worse, runs on until then). They show
in the dataset's graph as the ops below, in its functions (a map's, an
interleave's) too: `tpurun check` and `tpurun train` look for them there before
anything is registered with a dispatcher.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from tpurun import inputs, tf_internals
from tpurun.errors import UsageError
from tpurun.model import Model, TrainArrays
from tpurun.run_config import RunConfig
from tpurun.run_config.keys.service_keys import service

# Op type -> what the user wrote.
PYTHON_OPS = {
    "EagerPyFunc": "tf.py_function",
    "PyFunc": "tf.numpy_function",
    "PyFuncStateless": "tf.numpy_function",
    "GeneratorDataset": "Dataset.from_generator",
}
FIX = (
    "write that step in TensorFlow ops (tf.io, tf.image, tf.strings; from_tensor_slices or "
    "TFRecordDataset for a source), or drop config.data.service to make the input here"
)


def python_calls(dataset: tf.data.Dataset) -> list[str] | None:
    """What of PYTHON_OPS `dataset` calls; None when its graph cannot be read."""
    ops = tf_internals.dataset_ops(dataset)
    if ops is None:
        return None
    found = {PYTHON_OPS[op] for op in ops if op in PYTHON_OPS}
    if "Dataset.from_generator" in found:
        # Its generator runs through a numpy_function of its own: named once. A map's own
        # numpy_function beside it shows once the generator is gone.
        found.discard("tf.numpy_function")
    return sorted(found)


def refusal(calls: list[str], model_name: str) -> str:
    """The line that refuses a pipeline calling `calls`."""
    return (
        f"config.data.service: {model_name}.input_fn(train) calls {' and '.join(calls)} (found "
        "in its tf.data graph): Python code that the tf.data service's workers cannot run, "
        f"as it stays in this process; {FIX}"
    )


def refuse_python(dataset: tf.data.Dataset, model_name: str) -> None:
    """Raises UsageError (one line) if `dataset` calls Python; says so when it cannot tell."""
    calls = python_calls(dataset)
    if calls is None:
        logging.warning(
            "config.data.service: this TensorFlow cannot show %s.input_fn(train)'s graph, so it "
            "was not checked for tf.py_function, tf.numpy_function or Dataset.from_generator, "
            "which the service's workers cannot run.",
            model_name,
        )
        return
    if calls:
        raise UsageError(refusal(calls, model_name))


def checked_refusal(
    run: RunConfig, model: Model, arrays: TrainArrays | None, replicas: int
) -> str | None:
    """For `tpurun check`: the line `train` would refuse its input with under
    config.data.service (None: no service, or nothing to refuse), from input_fn(TRAIN) built
    as the service's workers would get it (one input pipeline, on `replicas` replicas)."""
    if service(run.config) is None:
        return None
    context = tf.distribute.InputContext(1, 0, replicas)
    params = inputs.input_params(context, run.train_batch_size, run.seed)
    calls = python_calls(inputs.train_dataset(model, params, arrays))
    return refusal(calls, type(model).__name__) if calls else None
