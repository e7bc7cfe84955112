"""Which config keys eval, predict and export take from the config their checkpoint was trained with.

A checkpoint holds the weights of the model its training config built: with
`--config.hidden_units=256` at train, a config file that says 512 builds a model
the checkpoint does not fit. So eval, predict and export build the model from the
trained config (model_dir/train_config.json), and take from the command line and
the config file only what says how the command itself runs:

* from the model_dir: every key the model defines for itself (any key that is not one
  of base_config's: `hidden_units`, `noise_dim`, a `generate` section, the `data`
  keys that shape the examples), `precision` (the policy it was trained under), the
  recipes `optimizer` and `optimizers` (whole: the moving averages are read through
  the optimizer that kept them) and `train.ema_decay` (whether the averages it kept
  are what is served);
* from the command line and the config file: `model`, `model_module` (where to import
  it from), `seed`, `name_map` (how a checkpoint tpurun did not write names the model's
  variables), the rest of `train.*` (how training runs: `eval --continuous` waits for
  its last step), `eval.*`, `predict.*` and where data live (the `data.*` keys ending
  in path, dir, files or pattern; `--data_dir`).

A key given on the command line always wins: `--precision=float32` predicts a
bfloat16-trained model in float32, `--config.generate.count=16` draws fewer samples.
Where such an override builds a model the checkpoint does not fit, the command fails
in one line naming the key and both values (`conflict`). Nothing here reads files or
imports TensorFlow: `tpurun.storage.train_config.for_serving` reads the record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import ml_collections

from tpurun.errors import CheckpointMismatch, UsageError
from tpurun.layout import names

# Config data.* keys whose value is where data live (a file, a directory, a pattern): a
# trained run's data may move (eval elsewhere), and a TPU node's host sees no local one.
DATA_LOCATION_SUFFIXES = ("path", "dir", "files", "pattern")

# Where training's input is made (a tf.data service): eval and predict read here anyway.
SERVICE_KEYS = ("data.service", "data.service_processing_mode", "data.service_timeout")
# Keys, and sections (ending in "."), that say how the command runs: the command line's
# and the config file's, never the model_dir's.
# (name_map: how a checkpoint tpurun did not write names the model's variables.)
RUN_KEYS = (
    "model",
    "model_module",
    "seed",
    "name_map",
    "train.",
    "eval.",
    "predict.",
    *SERVICE_KEYS,
)
# ...except these of train.*: whether a served model is its moving averages.
TRAINED_RUN_KEYS = ("train.ema_decay",)
# Sections taken whole from the model_dir, unless a key in them is given: a recipe of
# another name would not find the averages the checkpoint keeps.
WHOLE_SECTIONS = ("optimizer", "optimizers")


def from_training(key: str) -> bool:
    """Whether eval, predict and export take config key `key` (dotted) from the model_dir."""
    if key in TRAINED_RUN_KEYS:
        return True
    if key.startswith("data.") and key.endswith(DATA_LOCATION_SUFFIXES):
        return False
    return not any(key == k or (k.endswith(".") and key.startswith(k)) for k in RUN_KEYS)


@dataclasses.dataclass(frozen=True)
class Difference:
    """A model key whose trained value is not the one the config file or command line has."""

    key: str
    trained: Any
    now: Any

    def shown(self, now_is: str) -> str:
        """`hidden_units=(10, 10) (<now_is> (20, 20))`."""
        return f"{self.key}={_shown(self.trained)} ({now_is} {_shown(self.now)})"


@dataclasses.dataclass(frozen=True)
class Served:
    """The config eval, predict or export runs, and how it differs from the one given."""

    config: ml_collections.FrozenConfigDict
    # Taken from the model_dir where the config file says otherwise.
    taken: tuple[Difference, ...]
    # Given on the command line, unlike the trained value: the user's choice, unless the
    # checkpoint does not fit the model it builds (`conflict`).
    overridden: tuple[Difference, ...]


def serve(
    config: ml_collections.FrozenConfigDict, trained: Mapping[str, Any], given: Collection[str]
) -> Served:
    """The config of the model `trained` (a model_dir's trained config, as a dict) built,
    with the run keys of `config` (the config file and command line) and the keys `given`
    on the command line."""
    now = _flatten(_plain(config.to_dict()))
    before = _flatten(_plain(dict(trained)))

    def is_given(key: str) -> bool:
        return any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in given)

    served = dict(now)
    for section in WHOLE_SECTIONS:
        if not any(is_given(k) for k in now if k == section or k.startswith(section + ".")):
            served = {k: v for k, v in served.items() if not _in_section(k, section)}
    taken, overridden = [], []
    for key, value in before.items():
        if not from_training(key):
            continue
        if is_given(key):
            if key in now and now[key] != value:
                overridden.append(Difference(key, value, now[key]))
            continue
        served[key] = value
        if key in now and now[key] != value:
            taken.append(Difference(key, value, now[key]))
    return Served(
        ml_collections.FrozenConfigDict(_nested(served, config.to_dict())),
        tuple(sorted(taken, key=lambda d: d.key)),
        tuple(sorted(overridden, key=lambda d: d.key)),
    )


def conflict(model_dir: str, overridden: tuple[Difference, ...], reason: str) -> str | None:
    """The line for a checkpoint that does not fit the model the overrides built; None when
    nothing was overridden (then the trained config's own model does not fit: the model's
    code changed, a RunError of its own)."""
    if not overridden:
        return None
    listed = "; ".join(
        f"--config.{d.key}={_shown(d.now)}, trained with {_shown(d.trained)}" for d in overridden
    )
    return (
        f"the checkpoint in {model_dir} does not fit the model this command line builds "
        f"({listed}): {reason.rstrip('.')}. Drop the override (eval, predict and export build "
        f"the model {model_dir}/{names.TRAIN_CONFIG} records), or train a model_dir with it"
    )


@contextlib.contextmanager
def conflicts(model_dir: str, overridden: tuple[Difference, ...]) -> Iterator[None]:
    """Within: a checkpoint that does not fit the model the command line's overrides built
    is a UsageError (exit 2) naming them (`conflict`); any other mismatch stays what it is."""
    try:
        yield
    except CheckpointMismatch as e:
        line = conflict(model_dir, overridden, e.reason)
        if line is None:
            raise
        raise UsageError(line) from None


def _in_section(key: str, section: str) -> bool:
    return key == section or key.startswith(section + ".")


def _plain(value: Any) -> Any:
    """Lists for tuples, str for what JSON cannot hold: values compared as the record holds them."""
    return json.loads(json.dumps(value, default=str))


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value  # an empty section stays a key: `optimizers: {}`
    return flat


def _nested(flat: Mapping[str, Any], shaped_like: Mapping[str, Any]) -> dict[str, Any]:
    """The flat keys as sections again; a list where the config had a tuple is a tuple."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, leaf = key.split(".")
        node, like = nested, shaped_like
        for section in sections:
            node = node.setdefault(section, {})
            like = like.get(section, {}) if isinstance(like, Mapping) else {}
        original = like.get(leaf) if isinstance(like, Mapping) else None
        node[leaf] = _as_config_value(value, original)
    return nested


def _as_config_value(value: Any, original: Any) -> Any:
    if isinstance(value, list):
        return tuple(_as_config_value(v, None) for v in value)
    if isinstance(value, int) and isinstance(original, float) and not isinstance(value, bool):
        return float(value)  # JSON wrote 2.0 as 2.0, but a user's 2 stays a float field
    return value


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return repr(tuple(_shown_value(v) for v in value))
    return repr(value)


def _shown_value(value: Any) -> Any:
    return tuple(_shown_value(v) for v in value) if isinstance(value, list) else value
