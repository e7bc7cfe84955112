"""tpurun.run_config.splits: a model's eval splits and the config's choices among them (no TensorFlow)."""

from __future__ import annotations

import ml_collections
import pytest

from tpurun import config_defaults
from tpurun.errors import RunError, UsageError
from tpurun.run_config import splits


def config(**eval_keys) -> ml_collections.ConfigDict:
    built = config_defaults.base_config(model="m")
    for key, value in eval_keys.items():
        built.eval[key] = value
    return built


def model(names) -> type:
    return type("MyModel", (), {"eval_splits": names})


def test_a_model_that_declares_nothing_has_one_split_named_eval():
    chosen = splits.resolve(type("Plain", (), {}), config())
    assert chosen == splits.Splits(("eval",), best="eval", chosen="eval", also=())


@pytest.mark.parametrize(
    "names, best",
    [(("val", "test"), "val"), (("test", "val"), "val"), (("test", "holdout"), "test")],
)
def test_the_best_split_is_val_if_there_is_one_else_the_first(names, best):
    chosen = splits.resolve(model(names), config())
    assert (chosen.best, chosen.chosen) == (best, best)


def test_the_config_chooses_best_split_split_and_also():
    chosen = splits.resolve(
        model(("val", "test", "holdout")),
        config(best_split="holdout", split="test", also="test, val"),
    )
    assert (chosen.best, chosen.chosen, chosen.also) == ("holdout", "test", ("test", "val"))
    assert chosen.every_eval() == ("holdout", "test", "val")


@pytest.mark.parametrize(
    "key, message",
    [
        ("best_split", "config.eval.best_split=train is not a split of MyModel"),
        ("split", "--split=train is not a split of MyModel"),
        ("also", "config.eval.also=train is not a split of MyModel"),
    ],
)
def test_an_unknown_name_lists_the_models_splits(key, message):
    with pytest.raises(UsageError) as raised:
        splits.resolve(model(("val", "test")), config(**{key: "train"}))
    assert str(raised.value) == f"{message}; its splits are val, test"


@pytest.mark.parametrize("names", [(), ("val", "val"), ("../up",), ("a b",), (1,)])
def test_a_bad_declaration_is_the_models_error(names):
    with pytest.raises(RunError, match=r"^MyModel.eval_splits=.* must be a tuple of distinct"):
        splits.resolve(model(names), config())
