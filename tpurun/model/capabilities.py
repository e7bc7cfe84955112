"""What a model class provides (its own train step, train arrays, generate) and what build() returned, checked before a run builds or writes anything."""

from __future__ import annotations

import keras

from tpurun.errors import RunError, UsageError
from tpurun.model.interface import MODEL, Model


def build_models(model: Model) -> dict[str, keras.Model]:
    """Calls the model's build() (inside the caller's strategy scope) and checks the result:
    its models by name, MODEL for one."""
    name = type(model).__name__
    built = model.build()
    models = dict(built) if isinstance(built, dict) else {MODEL: built}
    for key, keras_model in models.items():
        if not isinstance(keras_model, keras.Model) or not keras_model.built:
            what = (
                "build() must return"
                if not isinstance(built, dict)
                else f"build()[{key!r}] must be"
            )
            raise RunError(
                f"{name}.{what} a built keras.Model (e.g. a functional model starting from "
                "keras.Input)"
            )
    if model.serving_model not in models:
        raise RunError(
            f"{name}.build() returned the models {', '.join(models)}; set {name}.serving_model "
            "to the one predict and export serve"
        )
    return models


def build_keras_model(model: Model) -> keras.Model:
    """The serving model of `build_models`."""
    return build_models(model)[model.serving_model]


def has_own_train_step(model: Model) -> bool:
    """Whether the model writes its own training step (not the default supervised one)."""
    return type(model).train_step is not Model.train_step


def check_model_config(model: Model) -> None:
    """What the model cannot do with its config, as a one-line UsageError before anything
    is built or written."""
    name, config, own = type(model).__name__, model.config, has_own_train_step(model)
    no_loss = type(model).loss is Model.loss
    if no_loss and not own:
        raise UsageError(f"{name} defines no loss(labels, outputs), which its training step needs")
    if no_loss and type(model).eval_step is Model.eval_step:
        raise UsageError(f"{name} defines no loss(labels, outputs) nor an eval_step of its own")
    if own and config.train.accumulate_steps > 1:
        raise UsageError(
            f"config.train.accumulate_steps={config.train.accumulate_steps}: {name} has a "
            "train_step of its own, which applies its own updates (accumulation is the default "
            "step's); set it to 1 and raise --batch_size instead"
        )
    named = list(config.get("optimizers") or {})
    if named and config.train.ema_decay and model.serving_model not in named:
        raise UsageError(
            f"config.train.ema_decay averages the serving model {model.serving_model!r}'s "
            f"weights in its optimizer, and config.optimizers has none of that name "
            f"({', '.join(named)}); add config.optimizers.{model.serving_model}, or ema_decay=0"
        )


def has_train_arrays(model: Model) -> bool:
    """Whether the model declares its training examples as arrays (so its stream seeks)."""
    return type(model).train_arrays is not Model.train_arrays


def has_generate(model: Model) -> bool:
    """Whether `tpurun predict` runs the model's own `generate` instead of `input_fn(PREDICT)`."""
    return type(model).generate is not Model.generate
