"""tpurun.model: the model interface's own logic: the registry, building, JSON rows, defaults."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from tpurun import config_defaults
from tpurun import model as model_lib
from tpurun.errors import RunError, UsageError
from tpurun.model import Classifier, InputParams, Mode, Model


class Tiny(Model):
    """A model whose build() returns what the test sets."""

    built: object = None

    def input_fn(self, mode, params):
        features = {"x": np.arange(8, dtype=np.float32).reshape(4, 2)}
        return tf.data.Dataset.from_tensor_slices(features).batch(params.batch_size)

    def build(self):
        return self.built() if callable(self.built) else self.built

    def loss(self, labels, outputs):
        return tf.zeros([tf.shape(outputs)[0]])


def config(**values) -> ml_collections.FrozenConfigDict:
    base = config_defaults.base_config(model="tiny")
    base.update(values)
    return ml_collections.FrozenConfigDict(base)


@pytest.fixture
def registry(monkeypatch) -> dict:
    """The model registry, emptied for the test and restored after it."""
    empty: dict = {}
    monkeypatch.setattr(model_lib.registry, "_REGISTRY", empty)
    return empty


# --- the registry --------------------------------------------------------------------------


def test_register_makes_a_model_available_by_name(registry):
    model_lib.register("tiny")(Tiny)
    model_lib.register("tiny")(Tiny)  # the same class again (a module imported twice): fine
    assert model_lib.registered_names() == ["tiny"]
    assert isinstance(model_lib.create(config()), Tiny)


def test_registering_another_class_under_a_taken_name_fails(registry):
    model_lib.register("tiny")(Tiny)

    class Other(Tiny):
        pass

    with pytest.raises(ValueError, match="model name 'tiny' is registered twice"):
        model_lib.register("tiny")(Other)


MODULE = """
from tpurun.model import Model, register


@register("tiny")
class FromItsModule(Model):
    input_fn = build = loss = None
"""


def test_create_imports_the_models_module(registry, tmp_path, monkeypatch):
    (tmp_path / "my_tiny_model.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = model_lib.create(config(model_module="my_tiny_model"))
    finally:
        sys.modules.pop("my_tiny_model", None)
    assert type(model).__name__ == "FromItsModule"


@pytest.fixture
def shipped_models_unimported(monkeypatch) -> Iterator[None]:
    """tpurun.models.* out of sys.modules for the test (imported again, they register in the
    test's registry); afterwards as they were."""
    shipped = [name for name in sys.modules if name.startswith("tpurun.models.")]
    for name in shipped:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [name for name in sys.modules if name.startswith("tpurun.models.")]:
        if name not in shipped:
            del sys.modules[name]


def test_create_of_an_unknown_model_names_the_known_ones(registry, shipped_models_unimported):
    """The registered ones and the shipped ones, which register when their module is imported."""
    model_lib.register("tiny")(Tiny)
    with pytest.raises(UsageError) as raised:
        model_lib.create(config(model="nope"))
    assert str(raised.value) == (
        "config.model='nope' is not a registered model (known: bert, bert_classifier, "
        "fashion_mnist, flops, iris, mnist, resnet50, shakespeare, tiny, wgan_gp); set "
        "config.model_module to the module that registers it"
    )


def test_a_models_module_with_a_missing_import_of_its_own_is_not_hidden(
    registry, tmp_path, monkeypatch
):
    (tmp_path / "needs_more.py").write_text("import no_such_package_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_package_anywhere"):
        model_lib.create(config(model_module="needs_more"))


def test_the_shipped_models_are_registered_on_demand():
    model = model_lib.create(config(model="iris", hidden_units=(4,), n_classes=3))
    assert type(model).__name__ == "Iris" and "iris" in model_lib.registered_names()


# --- building -------------------------------------------------------------------------------


def functional() -> keras.Model:
    inputs = keras.Input((2,))
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


def test_build_keras_model_returns_a_built_model():
    model = Tiny(config())
    model.built = functional
    assert isinstance(model_lib.build_keras_model(model), keras.Model)


def test_several_models_need_a_serving_one():
    model = Tiny(config())
    model.built = lambda: {"generator": functional(), "critic": functional()}
    with pytest.raises(
        RunError, match="returned the models generator, critic; set Tiny.serving_model"
    ):
        model_lib.build_models(model)
    model.serving_model = "generator"
    models = model_lib.build_models(model)
    assert list(models) == ["generator", "critic"]
    assert model_lib.build_keras_model(model) is not models["generator"]  # built anew


class OwnStep(Tiny):
    """A model with its own train_step and no loss."""

    serving_model = "generator"
    loss = Model.loss

    def train_step(self, step, features, labels):
        return {"d_loss": tf.constant(0.0)}


def named_optimizers(**train) -> ml_collections.FrozenConfigDict:
    base = config_defaults.base_config(model="tiny")
    for name in ("generator", "critic"):
        base.optimizers[name] = config_defaults.optimizer_recipe()
    base.train.update(train)
    return ml_collections.FrozenConfigDict(base)


@pytest.mark.parametrize(
    "model, message",
    [
        (OwnStep(named_optimizers()), "defines no loss(labels, outputs) nor an eval_step"),
        (
            type("NoLoss", (Tiny,), {"loss": Model.loss})(config()),
            "NoLoss defines no loss(labels, outputs), which its training step needs",
        ),
        (
            type("Eval", (OwnStep,), {"eval_step": lambda self, m, f, y: (y, f, f)})(
                named_optimizers(accumulate_steps=2)
            ),
            "accumulate_steps=2: Eval has a train_step of its own",
        ),
        (
            type("Eval", (OwnStep,), {"eval_step": lambda self, m, f, y: (y, f, f)})(
                config(train={**config().train.to_dict(), "ema_decay": 0.9})
            ),
            None,
        ),
    ],
    ids=["no_eval_step", "no_loss", "accumulation", "ema_with_config_optimizer"],
)
def test_what_a_model_cannot_do_with_its_config_is_one_line(model, message):
    if message is None:
        model_lib.check_model_config(model)
        return
    with pytest.raises(UsageError) as raised:
        model_lib.check_model_config(model)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_ema_of_named_optimizers_needs_one_for_the_serving_model():
    base = config_defaults.base_config(model="tiny")
    base.optimizers.critic = config_defaults.optimizer_recipe()
    base.train.ema_decay = 0.9
    model = type("Gan", (OwnStep,), {"eval_step": lambda self, m, f, y: (y, f, f)})(
        ml_collections.FrozenConfigDict(base)
    )
    with pytest.raises(UsageError, match="add config.optimizers.generator, or ema_decay=0"):
        model_lib.check_model_config(model)


@pytest.mark.parametrize(
    "built",
    [lambda: keras.Sequential([keras.layers.Dense(3)]), lambda: "a string", lambda: None],
    ids=["not_built", "not_a_model", "none"],
)
def test_build_keras_model_names_what_build_must_return(built):
    model = Tiny(config())
    model.built = built
    with pytest.raises(RunError) as raised:
        model_lib.build_keras_model(model)
    assert str(raised.value) == (
        "Tiny.build() must return a built keras.Model (e.g. a functional model starting "
        "from keras.Input)"
    )


# --- what predictions become ---------------------------------------------------------------


def test_to_json_gives_plain_values():
    row = {
        "class_ids": np.int32(2),
        "probabilities": np.array([0.25, 0.75], np.float32),
        "text": np.array(b"ROMEO: hi"),
        "words": np.array([b"a", "b\xc3\xa9".encode("latin-1")], dtype=object),
    }
    assert model_lib.to_json(row) == {
        "class_ids": 2,
        "probabilities": [0.25, 0.75],
        "text": "ROMEO: hi",
        "words": ["a", "bé"],
    }


def test_format_predictions_defaults_to_json_lines():
    model = Tiny(config())
    rows = [{"outputs": np.array([1.5, 2.0])}, {"outputs": np.array([0.0, -1.0])}]
    assert model.format_predictions(rows) == ['{"outputs": [1.5, 2.0]}', '{"outputs": [0.0, -1.0]}']


# --- defaults of the interface ---------------------------------------------------------------


def test_has_generate_only_when_a_model_defines_it():
    class Generating(Tiny):
        def generate(self, keras_model, strategy):
            return []

    assert model_lib.has_generate(Generating(config()))
    assert not model_lib.has_generate(Tiny(config()))
    with pytest.raises(NotImplementedError, match="Tiny does not define generate"):
        Tiny(config()).generate(None, None)


def test_optimizer_from_the_config():
    optimizer = Tiny(config(optimizer={"name": "sgd", "learning_rate": 0.25})).optimizer()
    assert isinstance(optimizer, keras.optimizers.SGD)
    assert float(optimizer.learning_rate) == 0.25


def test_an_unknown_optimizer_is_a_usage_error_naming_some():
    with pytest.raises(UsageError, match="config.optimizer.name='sgdd' is not a Keras optimizer"):
        Tiny(config(optimizer={"name": "sgdd", "learning_rate": 0.1})).optimizer()


def test_serving_input_spec_defaults_to_the_predict_features_with_any_batch():
    model = Tiny(config())
    params = InputParams(4, 4, 1, 0, 1, 0)
    spec = model.serving_input_spec(model.input_fn(Mode.PREDICT, params).element_spec)
    assert spec["x"].shape.as_list() == [None, 2] and spec["x"].dtype == tf.float32
    assert model.serving_features(spec) is spec


class TinyClassifier(Classifier):
    input_fn = Tiny.input_fn
    build = Tiny.build


def test_classifier_loss_metrics_and_predictions():
    classifier = TinyClassifier(config())
    logits = tf.constant([[0.0, 2.0], [3.0, 0.0]])
    labels = tf.constant([1, 1])
    loss = classifier.loss(labels, logits).numpy()
    np.testing.assert_allclose(loss, [np.log1p(np.exp(-2.0)), np.log1p(np.exp(3.0))], rtol=1e-6)
    assert list(classifier.metrics()) == ["accuracy"]
    predictions = classifier.predictions(logits)
    assert predictions["class_ids"].numpy().tolist() == [1, 0]
    np.testing.assert_allclose(predictions["probabilities"].numpy().sum(axis=1), [1.0, 1.0])
