"""The model interface: what a user implements to run a model with tpurun (its contract).

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
        def train_step(self, step, features, labels): ...  # optional: a step of its own

and selected by a config whose `model` key names it: `configs/<name>.py`, or a
config file of your own beside your model (docs/own-model.md).
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
  data, `tpurun.inputs.device_data`; with one replica the whole host loop is compiled by
  XLA), or feeds them through tf.data (`config.train.device_data=false`, or above
  the memory budget). Either way the batches are the same, reshuffled every epoch
  by `params.seed`, and a resumed run starts at its step in O(1).
* `build()` runs inside the distribution strategy's scope: create layers there,
  never pick devices.
* `loss` returns one value per example; the launcher weights, sums and scales it
  by the global batch (the same gradients on 1 or 8 replicas).
* `metrics` are fresh Keras metrics, updated as `metric.update_state(labels, outputs,
  sample_weight=mask)`; the launcher adds the mean `loss`.
* `predictions(outputs)` maps the model's outputs to named per-example tensors:
  what `tpurun predict` writes and the exported `serving_default` signature returns.
* Export serves `predictions(model(features))` with the features named and typed
  as `input_fn(PREDICT)` yields them, with a variable batch dimension; override
  `serving_input_spec` to accept something else, and `serving_features` to turn
  those inputs into the features (e.g. parse serialized tf.Example strings);
  `serving_signatures` to serve more signatures (resnet50: JPEG bytes, and images).

Optional: a training step of its own (a GAN: several models and optimizers,
alternating updates, a gradient penalty): `build()` returns its models by name,
`serving_model` names the one predict and export serve, and `train_step(step,
features, labels)` is one replica's step, written with what `step`
(`tpurun.training_step.Step`) hands it: named optimizers from
`config.optimizers.<name>`, global-batch scaling, draws keyed on (seed, step,
example). The default `train_step` is the supervised step above, written with the
same `Step`; `eval_step` may replace the default eval (docs/own-step.md).

Optional: a model whose `tpurun predict` is not "one output per input row" (a text
generator sampling from a prompt, a benchmark) overrides
`generate(keras_model, strategy)`. `tpurun predict` then restores the latest
checkpoint into `keras_model` (built by `build()` in the strategy's scope) and
writes the rows `generate` returns, through `format_predictions` or `--output`,
instead of running `input_fn(PREDICT)` through `predictions`. It runs eagerly on
the host: wrap its loops in `tf.function`, and call `strategy.run` to use the
replicas. Export, eval and `tpurun check` still use `input_fn`/`predictions`.

Optional: `diagnose_data(mode)`. A bad record fails inside the compiled loop, where
TensorFlow's error names an op, not the file: after a run fails with an
InvalidArgumentError or DataLossError, the launcher calls it to read `mode`'s data and
return one line, "data file F, record N: what is wrong; the fix" (the run's error), or
None. It runs only after a failure, so it may read everything
(`models/image_records.py` diagnoses its TFRecords).

What a model may assume: every batch a replica step sees has exactly
`params.batch_size` rows in every mode (static shapes); `build()` must still not bake
it in, as the export takes any batch size. Config files and the model's module may live anywhere: the
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
from collections.abc import Sequence
from typing import Any

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from tpurun import optimization, precision
from tpurun.errors import RunError, UsageError
from tpurun.model.arrays import TrainArrays
from tpurun.model.rows import json_line
from tpurun.training_step import OPTIMIZER, Step, supervised_step
from tpurun.training_step.state import unique

# The name of the one model of a Model whose build() returns a keras.Model.
MODEL = "model"


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
    # Which model of build()'s serves: predict, export, the default eval and warm start
    # use it (a GAN's generator). One model (a keras.Model from build()) is MODEL.
    serving_model: str = MODEL

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

    def train_record_files(self) -> Sequence[str] | None:
        """Optional: the TFRecord files input_fn(TRAIN) reads, uncompressed, one training
        example per record; None: it reads no such files (or a record is not an example).

        A run that says a length in epochs counts their records where that is cheap (on
        this machine's disk, up to a GiB: `tpurun.datasets.train_count`) instead of trusting
        `config.data.train_examples`, and warns when the two differ.
        """
        return None

    @abc.abstractmethod
    def build(self) -> keras.Model | dict[str, keras.Model]:
        """The Keras model mapping a batch of features to outputs (e.g. logits); or several
        by name, for a `train_step` of its own (`serving_model` names the one that serves)."""

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """Per-example loss, shape [batch]: what the default train and eval steps minimize
        and report (a model with its own `train_step` and `eval_step` needs none)."""
        raise RunError(
            f"{type(self).__name__} defines no loss(labels, outputs): the default train and "
            "eval steps need one; define it, or train_step and eval_step of its own"
        )

    def train_step(self, step: Step, features: Any, labels: Any) -> dict[str, tf.Tensor]:
        """One replica's training step; returns named scalars (each this replica's share).

        Default: the supervised step (`tpurun.training_step.supervised`), {"loss": ...}.
        """
        return supervised_step(self.loss, step, features, labels)

    def eval_step(
        self, models: dict[str, keras.Model], features: Any, labels: Any
    ) -> tuple[Any, Any, tf.Tensor]:
        """One replica's eval step: (labels, outputs, per-example loss) of its padded batch,
        for `metric.update_state(labels, outputs, mask)` and the mean `loss`. Default: the
        serving model's outputs (float32) and `loss`."""
        outputs = precision.float32(models[self.serving_model](features, training=False))
        return labels, outputs, self.loss(labels, outputs)

    def optimized_variables(self, models: dict[str, keras.Model]) -> dict[str, list[Any]]:
        """The variables each optimizer updates, by optimizer name: with config.optimizer,
        `optimizer` over every trainable variable; with config.optimizers, each over its
        model of the same name."""
        named = list(self.config.get("optimizers") or {})
        if not named:
            return {OPTIMIZER: unique([v for m in models.values() for v in m.trainable_variables])}
        unknown = [name for name in named if name not in models]
        if unknown:
            raise UsageError(
                f"config.optimizers.{unknown[0]}: {type(self).__name__}.build() has no model "
                f"{unknown[0]!r} (it has {', '.join(models)}); name each optimizer after the "
                "model it updates, or override optimized_variables to say which variables it does"
            )
        return {name: list(models[name].trainable_variables) for name in named}

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        """Eval metrics beyond the mean loss, which the launcher always reports."""
        return {}

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """Named per-example predictions derived from the model's outputs."""
        return {"outputs": outputs}

    def optimizer(self, name: str | None = None) -> keras.optimizers.Optimizer:
        """The optimizer config.optimizer (name None) or config.optimizers.<name> describes
        (tpurun.optimization). config.train.ema_decay is kept by the optimizer of the
        serving model's weights: config.optimizer's, or the named one of the serving
        model's name."""
        ema = name is None or name == self.serving_model
        return optimization.build_optimizer(
            self.config, self.config.train.batch_size, name, ema=ema
        )

    def predict_spec(self, params: InputParams) -> Any:
        """The spec of what input_fn(PREDICT) yields, from which export makes its signatures
        (`serving_signatures`). By default input_fn's own element_spec, which opens the
        predict data; a model whose features have a spec of their own returns it, so that
        its export (of a published checkpoint, say) needs no data."""
        return self.input_fn(Mode.PREDICT, params).element_spec

    def serving_input_spec(self, predict_spec: Any) -> Any:
        """The exported signature's inputs; by default what input_fn(PREDICT) yields,
        with a variable batch dimension."""
        return tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype, name=s.name), predict_spec
        )

    def serving_signatures(self, predict_spec: Any) -> dict[str, Any]:
        """The export's signatures by name, each its inputs' spec (by default `serving_default`
        alone); give each inputs of its own names, so that `serving_features` can tell."""
        return {"serving_default": self.serving_input_spec(predict_spec)}

    def serving_features(self, inputs: Any) -> Any:
        """The features `build()`'s model takes, from an exported signature's inputs
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
