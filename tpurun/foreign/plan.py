"""Which source variable fills which model variable, checked before a tensor is read.

A name-based checkpoint goes through config.name_map (`name_map`); an object-based one
(tpurun's own, any tf.train.Checkpoint) through the model's structure: its object graph
walked beside `tf.train.Checkpoint(model=<the model>)`, as a restore would; a TF2
SavedModel (whose root is the exported module, not a `model`) by the paths its
variables were saved with, which Keras' export records: the model's own. Either way
the outcome is a `Plan`: the pairs taken, and everything a user must hear of before
anything runs: the model variables that found nothing, the pairs whose shape or dtype
differ, the map's targets the model does not have, and what of the checkpoint is left
(optimizer slots by kind, the step, the rest).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Any

import keras
import tensorflow as tf

from tpurun.foreign import name_map as name_map_lib
from tpurun.foreign.sources import GLOBAL_STEP, Kind, Source, SourceVariable

# Object-based checkpoints' own counters and bookkeeping, grouped as "the step".
_STEP_NAMES = (GLOBAL_STEP, "step", "save_counter")


@dataclasses.dataclass(frozen=True)
class Taken:
    """A model variable filled from a source variable (reshaped when the rule says so)."""

    source: SourceVariable
    target: Any  # the model's keras.Variable
    reshape: bool = False


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A source variable sent to a model variable whose shape or dtype is not its own."""

    source: SourceVariable
    target: Any

    def line(self) -> str:
        return (
            f"{self.target.path} {spec(self.target.shape, self.target.dtype)} here, "
            f"{self.source.name} {spec(self.source.shape, self.source.dtype)} in the checkpoint"
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a fill from `source` would take, leave and refuse (`problems`)."""

    source: Source
    how: str  # "through config.name_map (107 rules)", "by the model's structure", ...
    model_variables: int  # the model's variables that are weights (floating)
    taken: list[Taken]
    mismatches: list[Mismatch]
    unfilled: list[str]  # model variables nothing fills (and no exclusion leaves out)
    not_in_model: list[tuple[str, str]]  # (source name, target) of a map's target not in the model
    kept: list[str]  # model variables `selected` leaves out: kept as built
    left: dict[str, list[str]]  # what of the source is not taken, by group

    @property
    def problems(self) -> int:
        return len(self.mismatches) + len(self.unfilled) + len(self.not_in_model)


def plan(
    source: Source,
    keras_model: keras.Model,
    rules: name_map_lib.NameMap,
    selected: re.Pattern[str] | None,
) -> Plan:
    """The plan of filling `keras_model` from `source`; `selected` (train.warm_start_vars):
    the model variables to fill, searched in their paths (None: every one)."""
    weights = [v for v in keras_model.variables if tf.as_dtype(v.dtype).is_floating]
    not_in_model: list[tuple[str, str]] = []
    left_out: set[str] = set()
    if source.kind is Kind.OBJECTS:
        pairs = _by_structure(source, keras_model)
        how = "by the model's structure (an object-based checkpoint: no name map)"
        if not pairs and source.saved_model:
            pairs = _by_saved_paths(source, keras_model)
            how = "by the paths its variables were saved with (a TF2 SavedModel: no name map)"
    else:
        pairs, not_in_model, left_out = _by_names(source, weights, rules)
        how = f"through config.{name_map_lib.CONFIG_KEY} ({len(rules.rules)} rules)"
        if not rules:
            how = f"by the model's own variable paths (config.{name_map_lib.CONFIG_KEY} is empty)"
    taken, mismatches, unfilled, kept = [], [], [], []
    used: set[str] = set()
    for variable in weights:
        wanted = selected is None or selected.search(variable.path) is not None
        found = pairs.get(variable.path)
        if not wanted:
            kept.append(variable.path)
        elif found is None:
            unfilled.append(variable.path)
        else:
            used.add(found[0].name)
            if _fits(found[0], variable, found[1]):
                taken.append(Taken(found[0], variable, found[1]))
            else:
                mismatches.append(Mismatch(found[0], variable))
    left = _left(source, used, left_out, {name for name, _ in not_in_model})
    return Plan(source, how, len(weights), taken, mismatches, unfilled, not_in_model, kept, left)


def _by_names(
    source: Source, weights: list[Any], rules: name_map_lib.NameMap
) -> tuple[dict[str, tuple[SourceVariable, bool]], list[tuple[str, str]], set[str]]:
    """Model variable path -> (source variable, reshape), the map's targets the model lacks,
    and the source names the map left out. An empty map takes each name as a model path."""
    paths = {v.path for v in weights}
    if not rules:
        pairs = {name: (v, False) for name, v in source.variables.items() if name in paths}
        return pairs, [], set()
    mapping = rules.resolve(source.variables)
    pairs, not_in_model = {}, []
    for name, (target, rule) in mapping.taken.items():
        if target in paths:
            pairs[target] = (source.variables[name], rule.reshape)
        elif not is_slot(name, source):  # a slot a broad rule caught is left, as a slot
            not_in_model.append((name, target))
    return pairs, not_in_model, set(mapping.left_out)


def _by_structure(
    source: Source, keras_model: keras.Model
) -> dict[str, tuple[SourceVariable, bool]]:
    """Model variable path -> the source variable a restore of `Checkpoint(model=...)` reads:
    the checkpoint's object graph walked beside the model's trackable children."""
    assert source.graph is not None
    by_key = {v.key: v for v in source.variables.values()}
    of_model = {id(v): v for v in keras_model.variables}
    pairs: dict[str, tuple[SourceVariable, bool]] = {}
    queue: collections.deque[tuple[int, Any]] = collections.deque(
        [(0, tf.train.Checkpoint(model=keras_model))]
    )
    seen: set[int] = set()
    while queue:
        node, obj = queue.popleft()
        if node in seen:
            continue
        seen.add(node)
        if id(obj) in of_model:
            found = [by_key[key] for key in source.graph.keys.get(node, []) if key in by_key]
            if found:
                pairs.setdefault(of_model[id(obj)].path, (found[0], False))
            continue
        own = tf.train.TrackableView.children(obj)
        children = source.graph.children.get(node, {})
        queue.extend((child, own[name]) for name, child in children.items() if name in own)
    return pairs


def _by_saved_paths(
    source: Source, keras_model: keras.Model
) -> dict[str, tuple[SourceVariable, bool]]:
    """Model variable path -> the source variable saved with that path (Keras' export saves
    each variable with its path): what a SavedModel of the same model holds."""
    paths = {v.path for v in keras_model.variables}
    pairs: dict[str, tuple[SourceVariable, bool]] = {}
    for variable in source.variables.values():
        if variable.saved_as in paths:
            pairs.setdefault(variable.saved_as, (variable, False))
    return pairs


def is_slot(name: str, source: Source) -> bool:
    """Whether `name` is `<variable>/<slot>` of another variable of a name-based checkpoint
    (`conv2d/kernel/Momentum`, `.../adam_m`, `.../ExponentialMovingAverage`): TF1 names
    nothing else below a variable's own name."""
    owner = name.rpartition("/")[0]
    return source.kind is Kind.NAMES and owner in source.variables


def _fits(source: SourceVariable, target: Any, reshape: bool) -> bool:
    if source.dtype != tf.as_dtype(target.dtype):
        return False
    shape = tuple(target.shape)
    if reshape:
        return math.prod(source.shape) == math.prod(shape)
    return source.shape == shape


def _left(source: Source, used: set[str], left_out: set[str], not_in_model: set[str]) -> dict:
    """What of the source is not taken, in groups: each optimizer slot kind (a `<variable>/
    <slot>` whose `<variable>` is in the checkpoint too: `.../Momentum`, `.../adam_m`), the
    step, the optimizer's own state (object-based), what the map left out, the rest."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    # An object-based checkpoint may hold a variable twice (a SavedModel's `variables` and
    # `_all_variables`): the copy of a taken one is not left.
    taken_as = {source.variables[name].saved_as for name in used} - {""}
    for name, variable in source.variables.items():
        if name in used or name in not_in_model or variable.saved_as in taken_as:
            continue
        if name in _STEP_NAMES or name.endswith(("/iterations", "/_iterations")):
            groups["step"].append(name)
        elif is_slot(name, source):
            groups[f"{name.rpartition('/')[2]} slots"].append(name)
        elif source.kind is Kind.OBJECTS and name.split("/", 1)[0] == "optimizer":
            groups["optimizer state"].append(name)
        elif name in left_out:
            groups["left out by the map"].append(name)
        else:
            groups["other"].append(name)
    return dict(groups)


def spec(shape: Any, dtype: Any) -> str:
    """`[2048, 1000] float32`."""
    return f"[{', '.join(str(d) for d in shape)}] {tf.as_dtype(dtype).name}"
