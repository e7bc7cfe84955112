"""The rules over a step's input: batch-split, batch-padding, static-batch, dtype.

They look at what each replica receives per step, as `tpurun.inputs` builds it,
before any step is traced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from tpurun.check.rules.findings import ERROR, WARNING, Problem, shape_text
from tpurun.check.rules.fixes import DTYPE_FIXES, train_batch_fix
from tpurun.model import Mode
from tpurun.run_config import split_fix

# XLA tiles the second-to-last dimension of a TPU array by 8: a per-core batch
# that is not a multiple of it is padded up, and the padding computed for nothing.
TPU_BATCH_MULTIPLE = 8
BATCH_FLAGS = {
    Mode.TRAIN: "--batch_size",
    Mode.EVAL: "--eval_batch_size",
    Mode.PREDICT: "--predict_batch_size",
}


def batch_split(global_batches: dict[Mode, int], replicas: int) -> list[Problem]:
    """Rules batch-split (error: a batch does not split evenly) and batch-padding (warning)."""
    problems = []
    for mode, flag in BATCH_FLAGS.items():
        size, n = global_batches[mode], replicas
        fix = split_fix(size, n, flag)
        if fix:
            problems.append(
                Problem(
                    "batch-split",
                    ERROR,
                    f"{flag}",
                    f"{flag}={size} does not split over the {n} replicas of the {{steps}}: "
                    "every TPU core needs the same static per-core batch",
                    fix,
                    mode,
                )
            )
        elif (size // n) % TPU_BATCH_MULTIPLE:
            per = size // n
            better = -(-per // TPU_BATCH_MULTIPLE) * TPU_BATCH_MULTIPLE
            problems.append(
                Problem(
                    "batch-padding",
                    WARNING,
                    f"{flag}",
                    f"{flag}={size} gives {per} example{'s' if per > 1 else ''} per "
                    f"replica in the {{steps}}, "
                    f"not a multiple of {TPU_BATCH_MULTIPLE}: the TPU pads each core's "
                    f"batch to {better} rows and computes the padding for nothing",
                    f"use a multiple of {n * TPU_BATCH_MULTIPLE} "
                    f"(e.g. {flag}={better * n}) if the data allows",
                    mode,
                )
            )
    return problems


def check_spec(mode: Mode, spec: Any, per_replica: int, model_name: str) -> list[Problem]:
    """Rules static-batch and dtype, on what crosses to the TPU: the batches one replica gets."""
    problems = []
    for path, leaf in spec_leaves(mode, spec):
        where = f"{path} from {model_name}.input_fn"
        shape = leaf.shape
        if mode is Mode.TRAIN:
            static = (
                shape.rank is not None
                and shape.rank > 0
                and shape.is_fully_defined()
                and shape[0] == per_replica
            )
            if not static:
                problems.append(
                    Problem(
                        "static-batch",
                        ERROR,
                        where,
                        f"{where} has shape {shape_text(shape)} in the {{steps}}: a TPU "
                        f"needs every batch to have one static shape, ({per_replica}, ...) "
                        f"here (the per-replica batch, then fixed dimensions)",
                        train_batch_fix(shape, per_replica),
                        mode,
                    )
                )
        elif shape.rank is None or not shape[1:].is_fully_defined():
            problems.append(
                Problem(
                    "static-batch",
                    ERROR,
                    where,
                    f"{where} has shape {shape_text(shape)} in the {{steps}}: the launcher "
                    "pads the batch dimension, but the other dimensions must be static",
                    "give every example the same shape: pad or crop variable-length "
                    "features to a fixed length (dataset.padded_batch(params.batch_size, "
                    "padded_shapes=<fixed shapes>), or tf.ensure_shape / set_shape in a map)",
                    mode,
                )
            )
        fix = DTYPE_FIXES.get(leaf.dtype)
        if fix:
            problems.append(
                Problem(
                    "dtype",
                    ERROR,
                    where,
                    f"{where} is {leaf.dtype.name} in the {{steps}}: {fix[0]}",
                    fix[1],
                    mode,
                )
            )
    return problems


def spec_leaves(mode: Mode, spec: Any) -> Iterator[tuple[str, tf.TensorSpec]]:
    """(description, spec) of every features/labels tensor; the launcher's mask is skipped."""
    parts = spec if isinstance(spec, tuple) else (spec,)
    if mode is not Mode.TRAIN:
        parts = parts[:-1]  # the padding mask the launcher appends
    expected = ["features"] if mode is Mode.PREDICT else ["features", "labels"]
    names = expected if len(parts) == len(expected) else []
    for index, part in enumerate(parts):
        base = names[index] if names else f"element[{index}]"
        for path, leaf in _flatten_with_paths(part):
            if isinstance(leaf, tf.TensorSpec):
                yield base + path, leaf


def _flatten_with_paths(structure: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(structure, dict):
        for key in sorted(structure):
            for path, leaf in _flatten_with_paths(structure[key]):
                yield f"[{key!r}]" + path, leaf
    elif isinstance(structure, (tuple, list)):
        for index, item in enumerate(structure):
            for path, leaf in _flatten_with_paths(item):
                yield f"[{index}]" + path, leaf
    else:
        yield "", structure
