"""The evaluation splits of a model, and which one the config chooses for what.

A model declares the splits it can evaluate (`Model.eval_splits`, e.g.
("val", "test")); the config says which one selects the best checkpoint
(`config.eval.best_split`), which one `tpurun eval` evaluates (`config.eval.split`,
`--split`), and which more `--eval_every` evaluates (`config.eval.also`). Only the
selecting split ever touches best/: choosing a checkpoint on the data it is then
reported on would make the report a lie.

Nothing here imports TensorFlow or the model interface: the names come in as a
tuple, from the model's class.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tpurun.errors import RunError, UsageError
from tpurun.layout import names

# What a model that declares nothing has: its one split, as before splits had names.
DEFAULT = ("eval",)
# Where the split of the old layout (eval/results-<step>.json) lives: the default
# split's results stay there, so a model that declares nothing keeps its model_dir.
LEGACY = names.LEGACY_SPLIT
# A split's name becomes a directory name (eval/<split>, eval_<split>): nothing else.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class Splits:
    """The model's split names and the config's choices among them."""

    names: tuple[str, ...]
    best: str  # selects the checkpoint kept in best/
    chosen: str  # what `tpurun eval` evaluates (--split)
    also: tuple[str, ...]  # evaluated too by --eval_every, never touching best/

    def every_eval(self) -> tuple[str, ...]:
        """What `train --eval_every` evaluates: the selecting split first, then the others."""
        return (self.best, *(name for name in self.also if name != self.best))


def declared(model_class: type, model_name: str) -> tuple[str, ...]:
    """The model's `eval_splits`, checked: a non-empty tuple of distinct directory-safe names."""
    names = getattr(model_class, "eval_splits", DEFAULT)
    if isinstance(names, str):
        names = (names,)
    if (
        not isinstance(names, (tuple, list))
        or not names
        or len(set(names)) != len(names)
        or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in names)
    ):
        raise RunError(
            f"{model_name}.eval_splits={names!r} must be a tuple of distinct split names "
            "(letters, digits, _ . -), e.g. ('val', 'test')"
        )
    return tuple(names)


def _one_of(names: tuple[str, ...], value: str, where: str, model_name: str) -> str:
    if value not in names:
        raise UsageError(
            f"{where}={value} is not a split of {model_name}; its splits are {', '.join(names)}"
        )
    return value


def resolve(model_class: type, config: Any) -> Splits:
    """The model's splits and the config's choices (`config.eval.*`), or a one-line UsageError."""
    model_name = model_class.__name__
    names = declared(model_class, model_name)
    best_split = str(config.eval.get("best_split", "") or "")
    if best_split:
        best = _one_of(names, best_split, "config.eval.best_split", model_name)
    else:
        best = "val" if "val" in names else names[0]
    chosen_split = str(config.eval.get("split", "") or "")
    chosen = _one_of(names, chosen_split, "--split", model_name) if chosen_split else best
    also = tuple(
        _one_of(names, name, "config.eval.also", model_name) for name in parse_also(config)
    )
    return Splits(names, best, chosen, also)


def parse_also(config: Any) -> tuple[str, ...]:
    """config.eval.also: split names separated by commas ("test" or "test,holdout")."""
    value = config.eval.get("also", "") or ""
    if isinstance(value, (tuple, list)):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(part.strip() for part in str(value).split(",") if part.strip())
