"""The model interface: what a user implements to run a model with tpurun.

A model is a subclass of `Model`, registered by name::

    from tpurun.model import InputParams, Mode, Model, register

    @register("my_model")
    class MyModel(Model):
        def input_fn(self, mode, params): ...   # tf.data.Dataset, batched by params.batch_size
        def train_arrays(self): ...             # optional: TrainArrays of in-memory examples
        def build(self): ...                    # a keras.Model: features -> outputs
        def loss(self, labels, outputs): ...    # per-example loss, shape [batch]
        def metrics(self): ...                  # {name: keras.metrics.Metric}
        def predictions(self, outputs): ...     # {name: tensor with a batch dimension}

and selected by a config whose `model` key names it: `configs/<name>.py`, or a
config file of your own beside your model (README, "Your own model").
A classifier (logits out, int32 class ids as labels) can subclass `Classifier`,
which supplies the loss, the accuracy metric and `class_ids`/`probabilities`.

What the launcher guarantees, so the model never needs a device branch:

* `input_fn(mode, params)` is called once per input pipeline (once per host) with
  `params.batch_size` = the *per-replica* batch (TPUEstimator's
  `params['batch_size']`): batch your dataset by it. It yields
  `(features, labels)` in TRAIN and EVAL and `features` in PREDICT, where
  `features` is a dict of named tensors (or one tensor).
  - TRAIN: repeat forever and batch with `drop_remainder=True`: a TPU needs every
    batch to have the same static shape. The stream must be a pure function of
    `params` (shuffle with `params.seed`; no unseeded randomness, no
    `deterministic=False`): a resumed run rebuilds it and continues at batch
    `params.start_batch`, so a run killed and resumed ends with the same weights
    as one that was not. Set `input_fn_seeks = True` and start there yourself
    (`tpurun.inputs.seekable_batches` does it in O(1) for in-memory arrays), or
    leave it False and the launcher skips the batches already trained on.
  - EVAL reads the split named `params.split`, one of the model's `eval_splits`
    (e.g. `("val", "test")`): the best checkpoint is chosen on one, reported on another.
  - EVAL / PREDICT: one pass, `drop_remainder=False`. The launcher pads the last
    batch to the static shape, masks the padding out of every metric and strips it
    from predictions, so evaluation is exact and N inputs give N outputs.
  - On several hosts, shard by `params.input_pipeline_id` / `num_input_pipelines`.
* `train_arrays()` (optional) declares training examples that are in-memory arrays:
  `TrainArrays((features, labels))`, numpy arrays with one row per example (or, for
  examples that are not rows, the arrays, their `count` and a `batch` function).
  Then `input_fn` is asked for EVAL and PREDICT only: the launcher keeps the arrays
  in every replica's memory and each replica step gathers its own batch (device
  data, `tpurun.device_data`; with one replica the whole host loop is compiled by
  XLA), or feeds them through tf.data (`config.train.device_data=false`, or above
  the memory budget). Either way the batches are the same, reshuffled every epoch
  by `params.seed`, and a resumed run starts at its step in O(1).
* `build()` runs inside the distribution strategy's scope: create layers there,
  never pick devices.
* `loss` returns one value per example; the launcher weights, sums and scales it
  by the global batch (the same gradients on 1 or 8 replicas).
* `metrics` are fresh Keras metrics, updated as
  `metric.update_state(labels, outputs, sample_weight=mask)`; the launcher adds
  the mean `loss`.
* `predictions(outputs)` maps the model's outputs to named per-example tensors:
  what `tpurun predict` writes and the exported `serving_default` signature returns.
* Export serves `predictions(model(features))` with the features named and typed
  as `input_fn(PREDICT)` yields them, with a variable batch dimension; override
  `serving_input_spec` to accept something else, and `serving_features` to turn
  those inputs into the features (e.g. parse serialized tf.Example strings).

Optional: a model whose `tpurun predict` is not "one output per input row" (a text
generator sampling from a prompt, a benchmark) overrides
`generate(keras_model, strategy)`. `tpurun predict` then restores the latest
checkpoint into `keras_model` (built by `build()` in the strategy's scope) and
writes the rows `generate` returns, through `format_predictions` or `--output`,
instead of running `input_fn(PREDICT)` through `predictions`. It runs eagerly on
the host: wrap its loops in `tf.function`, and call `strategy.run` to use the
replicas. Export, eval and `tpurun check` still use `input_fn`/`predictions`.

Optional: `diagnose_data(mode)`. A bad record (a feature of the wrong type or size,
a truncated file) fails inside the compiled loop, where TensorFlow's error names an
op, not the file. When a train, eval or predict run fails with an InvalidArgumentError
or DataLossError, the launcher calls `diagnose_data(mode)`: read `mode`'s data record
by record and return one line, "data file F, record N: what is wrong; the fix", which
becomes the run's error, or None if the data are fine (TensorFlow's error is shown
then). It runs only after a failure, so it may read everything; never scan the data
on the happy path. `models/image_records.py` diagnoses its TFRecords.

What a model may assume: every batch a replica step sees has exactly
`params.batch_size` rows, in every mode (eval and predict batches are padded), so
shapes are static; `build()` must still not bake the batch size in, as the export
takes any batch size. Config files and the model's module may live anywhere: the
config file's directory is put on `sys.path`, so `config.model_module = "my_model"`
imports `my_model.py` beside it.

What a model must not do: call `tf.summary` or Python side effects inside `build`'s
call path, use int64 or float64 features on a TPU (cast to int32/float32 in the
input function), produce tensors whose shape depends on the data (`tf.unique`,
`tf.boolean_mask`, ...), or open files with `open()` / `os.path`: read them with
tf.data or `tf.io.gfile`, so that `gs://` paths work (on a TPU node the tf.data
pipeline runs on the TPU's own host, which sees `gs://` but not this machine's
disk). `tpurun check` finds the graph problems on a CPU.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
from collections.abc import Callable
from typing import Any, TypeVar

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from tpurun import optimization
from tpurun.errors import RunError, UsageError


class Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "predict"


@dataclasses.dataclass(frozen=True)
class InputParams:
    """What an input function may know about where its batches go."""

    batch_size: int  # per replica: batch the dataset by this
    global_batch_size: int  # across all replicas (the --batch_size flag)
    num_replicas: int  # replicas (TPU cores, GPUs, logical CPUs) in sync
    input_pipeline_id: int  # this host's pipeline, in [0, num_input_pipelines)
    num_input_pipelines: int  # hosts feeding the replicas
    seed: int  # for shuffling: the same seed gives the same order
    # TRAIN, resumed at a step: batches this pipeline already delivered before it.
    # A model with `input_fn_seeks = True` starts its stream there itself.
    start_batch: int = 0
    # EVAL: which of the model's `eval_splits` to read (None in TRAIN and PREDICT).
    split: str | None = None


class TrainArrays:
    """A model's training examples held in memory: what `Model.train_arrays` returns.

    `arrays` are numpy arrays (any nested structure) that the launcher places once in
    every replica's memory. By default they are `(features, labels)` with one row per
    example, and a batch is some of their rows. Examples that are not rows (the
    windows of a text) give `count`, how many there are, and `batch(arrays, rows)`:
    the `(features, labels)` of the examples `rows` (int32 [n]) made from `arrays`
    (as tensors). It runs inside the compiled training step: TensorFlow ops only,
    static shapes (`tf.gather`, slicing, arithmetic).

    Arrays too large to make for nothing can be declared instead:
    `TrainArrays.declare(specs, build, count=..., batch=...)` gives their shapes and
    dtypes (`tf.TensorSpec`s in the structure `build()` returns) and `build`, which
    makes them when a run first needs their values. `tpurun check` sizes the
    training step from `specs` alone, and never calls `build`.
    """

    def __init__(
        self,
        arrays: Any = None,
        count: int | None = None,
        batch: Callable[[Any, tf.Tensor], Any] | None = None,
        *,
        specs: Any = None,
        build: Callable[[], Any] | None = None,
    ):
        if (arrays is None) == (build is None):
            raise TypeError("TrainArrays takes the arrays, or (declare) their specs and build")
        if build is not None and specs is None:
            raise TypeError("TrainArrays.declare needs the arrays' specs")
        self._arrays = arrays
        self._specs = specs
        self._build = build
        self.count = count
        self.batch = batch

    @classmethod
    def declare(
        cls,
        specs: Any,
        build: Callable[[], Any],
        count: int | None = None,
        batch: Callable[[Any, tf.Tensor], Any] | None = None,
    ) -> TrainArrays:
        """Arrays known by their `specs` (shapes, dtypes), made by `build()` when needed."""
        return cls(count=count, batch=batch, specs=specs, build=build)

    @property
    def arrays(self) -> Any:
        """The arrays' values (declared ones are built on first use, and checked against
        their specs)."""
        if self._arrays is None:
            assert self._build is not None
            built = self._build()
            _check_built(built, self._specs)
            self._arrays = built
        return self._arrays

    @property
    def specs(self) -> Any:
        """The arrays as `tf.TensorSpec`s, in their structure: nothing is built for them."""
        if self._specs is not None:
            return tf.nest.map_structure(_as_spec, self._specs)
        return tf.nest.map_structure(_spec_of, self._arrays)

    @property
    def num_examples(self) -> int:
        if self.count is not None:
            return self.count
        first = tf.nest.flatten(self.specs)[0]
        return int(first.shape[0])

    def examples(self, arrays: Any, rows: tf.Tensor) -> Any:
        """The `(features, labels)` of the examples `rows` (int32, any shape [..., n])."""
        if self.batch is None:
            return tf.nest.map_structure(lambda t: tf.gather(t, rows), arrays)
        flat = self.batch(arrays, tf.reshape(rows, [-1]))
        return tf.nest.map_structure(lambda t: tf.reshape(t, [*rows.shape, *t.shape[1:]]), flat)


def _as_spec(spec: Any) -> tf.TensorSpec:
    if isinstance(spec, tf.TensorSpec):
        return spec
    return tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype))  # np.ndarray or ShapeDtype-like


def _spec_of(array: Any) -> tf.TensorSpec:
    value = array if hasattr(array, "dtype") and hasattr(array, "shape") else np.asarray(array)
    return tf.TensorSpec(np.shape(value), tf.as_dtype(value.dtype))


def _check_built(built: Any, specs: Any) -> None:
    """Declared arrays must be what their specs said: `tpurun check` sized those."""
    try:
        tf.nest.assert_same_structure(built, specs)
    except (ValueError, TypeError) as e:
        raise RunError(
            f"TrainArrays.declare: build() returned another structure than its specs ({e})"
        ) from None
    for value, spec in zip(tf.nest.flatten(built), tf.nest.flatten(specs), strict=True):
        got, want = _spec_of(value), _as_spec(spec)
        if got.shape != want.shape or got.dtype != want.dtype:
            raise RunError(
                f"TrainArrays.declare: build() made a {got.dtype.name}{got.shape.as_list()} "
                f"array where the specs say {want.dtype.name}{want.shape.as_list()}; make "
                "them agree"
            )


class Model(abc.ABC):
    """Base class of tpurun models; see the module docstring for the contract."""

    # Whether input_fn(TRAIN) itself starts at `params.start_batch` (cheaply, e.g. with
    # `tpurun.inputs.seekable_batches`). If not, a resumed run skips that many
    # batches of the stream, which reads them all: resume cost grows with the step.
    input_fn_seeks = False
    # The splits input_fn(EVAL) can read, by name: it gets one in `params.split`. The
    # best checkpoint is chosen on config.eval.best_split (default: "val" if there is
    # one, else the first), `tpurun eval --split=NAME` reports on any. A model that
    # declares nothing has one split, "eval".
    eval_splits: tuple[str, ...] = ("eval",)

    def __init__(self, config: ml_collections.FrozenConfigDict):
        self.config = config

    @abc.abstractmethod
    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        """The dataset for `mode`, batched by `params.batch_size`."""

    def train_arrays(self) -> TrainArrays | None:
        """Optional: the training examples as in-memory arrays; None: `input_fn(TRAIN)`.

        A model that returns them is never asked for `input_fn(TRAIN)`: the launcher
        keeps the arrays in each replica's memory and the compiled step gathers its
        own batches (or, turned off or too large, feeds them through tf.data), in the
        same order either way.
        """
        return None

    @abc.abstractmethod
    def build(self) -> keras.Model:
        """The Keras model mapping a batch of features to outputs (e.g. logits)."""

    @abc.abstractmethod
    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """Per-example loss, shape [batch]."""

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        """Eval metrics beyond the mean loss, which the launcher always reports."""
        return {}

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """Named per-example predictions derived from the model's outputs."""
        return {"outputs": outputs}

    def optimizer(self) -> keras.optimizers.Optimizer:
        """The optimizer config.optimizer and train.ema_decay describe (tpurun.optimization)."""
        return optimization.build_optimizer(self.config, self.config.train.batch_size)

    def serving_input_spec(self, predict_spec: Any) -> Any:
        """The exported signature's inputs; by default what input_fn(PREDICT) yields,
        with a variable batch dimension."""
        return tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype, name=s.name), predict_spec
        )

    def serving_features(self, inputs: Any) -> Any:
        """The features `build()`'s model takes, from the exported signature's inputs
        (`serving_input_spec`); the inputs themselves by default."""
        return inputs

    def format_predictions(self, rows: list[dict[str, np.ndarray]]) -> list[str]:
        """Lines `tpurun predict` prints for rows of predictions; JSON by default."""
        return [json_line(row) for row in rows]

    def generate(
        self, keras_model: keras.Model, strategy: tf.distribute.Strategy
    ) -> list[dict[str, Any]]:
        """Optional: a model-specific `tpurun predict` (see the module docstring).

        Gets the restored model and the run's strategy; returns the rows to write,
        each a dict of named values (numpy arrays, numbers or strings).
        """
        raise NotImplementedError(f"{type(self).__name__} does not define generate()")

    def diagnose_data(self, mode: Mode) -> str | None:
        """Optional: after TensorFlow failed on `mode`'s data, the first bad record.

        One line naming the file, the record and the fix, or None when the data are
        fine; see the module docstring.
        """
        return None


def build_keras_model(model: Model) -> keras.Model:
    """Calls the model's build() (inside the caller's strategy scope) and checks the result."""
    keras_model = model.build()
    if not isinstance(keras_model, keras.Model) or not keras_model.built:
        raise RunError(
            f"{type(model).__name__}.build() must return a built keras.Model "
            "(e.g. a functional model starting from keras.Input)"
        )
    return keras_model


def has_train_arrays(model: Model) -> bool:
    """Whether the model declares its training examples as arrays (so its stream seeks)."""
    return type(model).train_arrays is not Model.train_arrays


def has_generate(model: Model) -> bool:
    """Whether `tpurun predict` runs the model's own `generate` instead of `input_fn(PREDICT)`."""
    return type(model).generate is not Model.generate


def to_json(row: dict[str, np.ndarray]) -> dict[str, Any]:
    """A row of numpy predictions as plain values that strict JSON can hold.

    NaN and infinity (a diverged model's outputs) are not JSON: they become null.
    """
    out: dict[str, Any] = {}
    for key, value in row.items():
        value = np.asarray(value)
        if value.dtype.kind in "SO":
            value = np.char.decode(value.astype(bytes), "utf-8")
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            value = value.astype(object)
            value[~np.isfinite(value.astype(float))] = None
        out[key] = value.tolist()
    return out


def json_line(row: dict[str, np.ndarray]) -> str:
    """One row of predictions as a line of strict JSON (no NaN, no Infinity)."""
    return json.dumps(to_json(row), allow_nan=False)


class Classifier(Model):
    """A Model whose outputs are class logits and whose labels are int32 class ids.

    Supplies the loss (softmax cross-entropy), the accuracy metric and the
    `class_ids` / `probabilities` predictions; subclasses still provide
    `input_fn` and `build`.
    """

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {
            "class_ids": tf.argmax(outputs, axis=-1, output_type=tf.int32),
            "probabilities": tf.nn.softmax(outputs),
        }


_REGISTRY: dict[str, type[Model]] = {}
ModelClass = TypeVar("ModelClass", bound=type[Model])


def register(name: str) -> Callable[[ModelClass], ModelClass]:
    """Class decorator: makes the model available to configs as `config.model = name`."""

    def add(cls: ModelClass) -> ModelClass:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"model name {name!r} is registered twice")
        _REGISTRY[name] = cls
        return cls

    return add


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def create(config: ml_collections.FrozenConfigDict) -> Model:
    """Imports the model's module if needed and instantiates the registered class."""
    import importlib

    name = config.model
    modules = [config.model_module] if config.get("model_module") else []
    modules.append(f"tpurun.models.{name}")
    for module in modules:
        if name in _REGISTRY:
            break
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not module.startswith(e.name):
                raise  # the module exists but one of its own imports is missing
    if name not in _REGISTRY:
        raise UsageError(
            f"config.model={name!r} is not a registered model (known: "
            f"{', '.join(registered_names()) or 'none'}); set config.model_module to the "
            "module that registers it"
        )
    return _REGISTRY[name](config)
