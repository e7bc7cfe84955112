"""What changes with the replica count: per-replica statistics (rule `batch-norm`).

Gradients are summed over the replicas, so a model whose loss is a sum of
per-example terms trains the same weights on 1 and 8 replicas (docs/replicas.md).
A BatchNormalization layer breaks that: in training it normalises each replica's
batch by that batch's own mean and variance, so on 8 replicas of a global batch
of 32 it normalises groups of 4, a different model from the one normalised over
all 32. Under MirroredStrategy each replica also
updates its own copy of the moving mean and variance (Keras gives them no
aggregation), and a checkpoint keeps the first replica's. `synchronized=True`
computes the statistics over the global batch (three small all-reduces per layer
per step):
1 and 8 replicas then train the same weights (tests/test_replica_fidelity.py).

`tpurun check` says it as a warning (the run works; it is another model), and
`tpurun train` says it once at the start of a multi-replica run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

import keras

from tpurun.check.rules.findings import WARNING, Problem
from tpurun.check.rules.introspection import all_layers
from tpurun.model import Mode

# Past this many, the layers are counted rather than named (a ResNet-50 has 53).
NAMED_LAYERS = 6
# A per-replica batch whose statistics are usually called stable enough (Ghost
# BatchNorm's 32); only the suggested batch in the fix uses it.
STATISTICS_BATCH = 32


# One model, or every model a training step trains.
Models: TypeAlias = "keras.layers.Layer | Iterable[keras.layers.Layer]"


def unsynchronized_batch_norms(models: Models) -> list[str]:
    """The BatchNormalization layers of `models` (one model, or every model a training step
    trains: a GAN's generator and critic; nested ones too) that normalise by each
    replica's own statistics, by their Keras path (`block_1/batch_normalization`)."""
    found: list[str] = []
    seen: set[int] = set()
    for model in [models] if isinstance(models, keras.layers.Layer) else list(models):
        for layer in all_layers(model):
            if id(layer) in seen:  # a layer two models share
                continue
            seen.add(id(layer))
            if isinstance(layer, keras.layers.BatchNormalization) and not getattr(
                layer, "synchronized", False
            ):
                found.append(getattr(layer, "path", None) or layer.name)
    return found


def batch_norm_text(layers: list[str], replicas: int, global_batch: int) -> tuple[str, str]:
    """(what happens, the fix) for `layers` trained on `replicas` replicas, with "{steps}"
    for the step (check fills it in)."""
    per_replica = global_batch // replicas
    shown = ", ".join(layers[:NAMED_LAYERS])
    if len(layers) > NAMED_LAYERS:
        shown += f" and {len(layers) - NAMED_LAYERS} more"
    what = "BatchNormalization layer" + ("s" if len(layers) > 1 else "")
    normalise = "normalise" if len(layers) > 1 else "normalises"
    larger = max(STATISTICS_BATCH, 2 * per_replica)
    message = (
        f"{len(layers)} {what} ({shown}) {normalise} each replica's batch by its own mean and "
        f"variance: on {replicas} replicas each normalises {per_replica} of the "
        f"{global_batch} examples of the {{steps}}, so the run trains a different model "
        "than on 1 replica"
    )
    fix = (
        f"create {'them' if len(layers) > 1 else 'it'} with "
        "keras.layers.BatchNormalization(..., synchronized=True) "
        "(statistics over the global batch, as on 1 replica; three small all-reduces per "
        f"layer per step), or give each replica a larger batch (--batch_size={larger * replicas}: "
        f"{larger} per replica), whose statistics come closer to the global batch's"
    )
    return message, fix


def batch_norm_problems(models: Models, replicas: int, global_batch: int) -> list[Problem]:
    """Rule `batch-norm` (a warning) for the train step of `models` on `replicas`: none on one."""
    layers = unsynchronized_batch_norms(models) if replicas > 1 else []
    if not layers:
        return []
    message, fix = batch_norm_text(layers, replicas, global_batch)
    return [Problem("batch-norm", WARNING, "{steps}", message, fix, Mode.TRAIN)]


def batch_norm_warning(models: Models, replicas: int, global_batch: int) -> str | None:
    """What `tpurun train` logs once at the start: the finding `check` would report."""
    layers = unsynchronized_batch_norms(models) if replicas > 1 else []
    if not layers:
        return None
    message, fix = batch_norm_text(layers, replicas, global_batch)
    return f"{message.replace('{steps}', 'train step')}. Fix: {fix}."
