"""The model interface: what a user implements to run a model with tpurun.

    from tpurun.model import InputParams, Mode, Model, register

Its contract is the docstring of `interface` (docs/own-model.md):

* `interface`: `Model` (input_fn, build, loss, metrics, predictions, and the optional
  train_arrays, train_record_files, train_step, eval_step, generate, diagnose_data,
  serving signatures), `Mode`, `InputParams`;
* `arrays`: `TrainArrays`, training examples as in-memory arrays;
* `classifier`: `Classifier`, the loss, accuracy and predictions of class logits;
* `registry`: `register` (a config's `model` name), `create`;
* `capabilities`: what a model class provides, and `check_model_config` (before a run);
* `rows`: predictions as strict JSON.

What a model's own training step is handed (`Step`, keyed random draws) is
`tpurun.training_step`'s, re-exported here for models.
"""

from __future__ import annotations

from tpurun.model.arrays import TrainArrays
from tpurun.model.capabilities import (
    build_keras_model,
    build_models,
    check_model_config,
    has_generate,
    has_own_train_step,
    has_train_arrays,
)
from tpurun.model.classifier import Classifier
from tpurun.model.interface import MODEL, InputParams, Mode, Model
from tpurun.model.registry import ModelClass, create, register, registered_names
from tpurun.model.rows import json_line, to_json
from tpurun.training_step import OPTIMIZER, KeyedDropout, KeyedRandom, Step

__all__ = [
    "MODEL",
    "OPTIMIZER",
    "Classifier",
    "InputParams",
    "KeyedDropout",
    "KeyedRandom",
    "Mode",
    "Model",
    "ModelClass",
    "Step",
    "TrainArrays",
    "build_keras_model",
    "build_models",
    "check_model_config",
    "create",
    "has_generate",
    "has_own_train_step",
    "has_train_arrays",
    "json_line",
    "register",
    "registered_names",
    "to_json",
]
