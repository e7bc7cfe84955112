"""What each finding of `tpurun check` says, and how to fix it: the words, apart from the rules."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun.check.rules.findings import ERROR, STEP_NAMES, Problem, shape_text
from tpurun.check.rules.graph_walk import CONTROL_FLOW_OPS, DATA_DEPENDENT_OPS, RawFinding
from tpurun.check.rules.introspection import LayerScopes
from tpurun.check.rules.origin import created_at
from tpurun.errors.tf_errors import user_code_line
from tpurun.model import Mode

DTYPE_FIXES = {
    tf.int64: (
        "TPUs take no int64 input (the infeed rejects it, or it is emulated slowly)",
        "cast it to int32 in the input function: dataset.map(lambda f, l: (f, tf.cast(l, "
        "tf.int32))), or build the numpy arrays as int32",
    ),
    tf.float64: (
        "TPUs have no float64",
        "cast it to float32 in the input function (numpy arrays default to float64: "
        "np.asarray(x, np.float32))",
    ),
    tf.string: (
        "TPUs have no string type",
        "turn strings into int32 ids (or numbers) in the input function, e.g. with a "
        "tf.lookup.StaticHashTable in dataset.map",
    ),
}


def train_batch_fix(shape: tf.TensorShape, per_replica: int) -> str:
    if shape.rank == 0:
        return "batch the dataset: dataset.batch(params.batch_size, drop_remainder=True)"
    if shape.rank is not None and shape[0] is not None and shape[0] != per_replica:
        return (
            f"batch by params.batch_size (the per-replica batch, {per_replica}), not by "
            "params.global_batch_size or a constant: "
            "dataset.batch(params.batch_size, drop_remainder=True)"
        )
    if shape.rank is not None and shape[0] is None:
        return (
            "batch with dataset.batch(params.batch_size, drop_remainder=True) (without "
            "drop_remainder the last batch may be smaller, so the batch dimension is unknown)"
            + ("" if shape[1:].is_fully_defined() else "; and give every example the same shape")
        )
    return (
        "give every example the same shape: pad or crop variable-length features to a fixed "
        "length (dataset.padded_batch(params.batch_size, padded_shapes=<fixed shapes>, "
        "drop_remainder=True))"
    )


# The usual fix for each op whose output size depends on the values of its input
# (graph_walk.DATA_DEPENDENT_OPS); a variant (UniqueV2, NonMaxSuppressionV5) takes
# its base op's.
DATA_DEPENDENT_FIXES = {
    "Where": "keep the shape: multiply by a 0/1 mask (x * tf.cast(mask, x.dtype)), or use "
    "tf.where(cond, x, y) with three arguments",
    "Unique": "avoid tf.unique in the step: count or deduplicate with fixed-size ops (e.g. "
    "tf.math.unsorted_segment_sum with a constant num_segments), or in the input function",
    "ListDiff": "tf.sets / tf.setdiff1d return data-dependent sizes; use masks of fixed size",
    "DynamicPartition": "use masks (tf.where(cond, x, y)) instead of tf.dynamic_partition",
    "DynamicStitch": "use masks (tf.where(cond, x, y)) instead of tf.dynamic_stitch, or "
    "tf.tensor_scatter_nd_update into a tensor of fixed size",
    "NonMaxSuppression": "use tf.image.non_max_suppression_padded (fixed-size output)",
    "Bincount": "use tf.math.bincount with minlength = maxlength = a constant, or "
    "tf.math.unsorted_segment_sum with a constant num_segments",
    "DenseBincount": "use tf.math.bincount with minlength = maxlength = a constant, or "
    "tf.math.unsorted_segment_sum with a constant num_segments",
    "StringSplit": "split strings in the input function",
    "DenseToDenseSetOperation": "tf.sets ops return data-dependent sizes; use masks",
    "DenseToSparseSetOperation": "tf.sets ops return data-dependent sizes; use masks",
}
GENERIC_DYNAMIC_FIX = (
    "compute it with a fixed size: pad or mask to a static maximum instead of selecting "
    "a data-dependent number of elements, and take sizes from constants or tensor.shape, "
    "not from tensor values"
)


def data_dependent_fix(op_type: str) -> str:
    """The fix for one of graph_walk.DATA_DEPENDENT_OPS (a variant: its base op's)."""
    base = re.sub(r"(V\d+|WithCounts(V\d+)?)$", "", op_type)
    return (
        DATA_DEPENDENT_FIXES.get(op_type)
        or DATA_DEPENDENT_FIXES.get(base)
        or DATA_DEPENDENT_FIXES.get(base + "Split")
        or GENERIC_DYNAMIC_FIX
    )


def dynamic_fix(op: tf.Operation, display: str) -> str:
    if "boolean_mask" in display:
        return (
            "replace tf.boolean_mask by multiplying with a 0/1 mask "
            "(x * tf.cast(mask, x.dtype)), keeping the shape"
        )
    if op.type in DATA_DEPENDENT_OPS:
        return data_dependent_fix(op.type)
    if op.type in ("While", "StatelessWhile"):
        return (
            "keep every tf.while_loop variable the same static shape (no None in "
            "shape_invariants): preallocate the full size and write into it"
        )
    if op.type in CONTROL_FLOW_OPS:
        return "make both branches of tf.cond return tensors of the same static shape"
    return GENERIC_DYNAMIC_FIX


def unsupported_problem(mode: Mode, about: str, created: str, where: str, op_type: str) -> Problem:
    if op_type in ("EagerPyFunc", "PyFunc", "PyFuncStateless"):
        fix = (
            "tf.py_function / tf.numpy_function run Python, which a TPU cannot: write it "
            "with TensorFlow ops, or move it into the input function (dataset.map)"
        )
    elif op_type in ("PrintV2", "Print", "StringFormat"):
        fix = "remove tf.print from the model (print in the input function, or evaluate a metric)"
    elif op_type.startswith(("String", "AsString", "Regex", "Substr", "Unicode", "Decode")):
        fix = "do string processing in the input function (dataset.map), outside the step"
    else:
        fix = (
            f"replace the op that makes {op_type} by ops XLA supports, or move it into the "
            "input function"
        )
    return Problem(
        "xla-unsupported",
        ERROR,
        where,
        f"{about} has no XLA kernel, so the {{steps}} cannot be compiled for a TPU{created}",
        fix,
        mode,
        op_type=op_type,
    )


def graph_problems(found: list[RawFinding], scopes: LayerScopes, mode: Mode) -> list[Problem]:
    """The problems of a graph walk's raw findings, one per cause (see the comments)."""
    # What a tf.summary call computes for itself (a histogram's buckets: float64,
    # dynamic shapes) is part of the summary problem, not a problem of its own.
    summary_scopes = tuple(
        display.rsplit("/", 1)[0] + "/"
        for rule, _, display, _ in found
        if rule == "summary" and "/" in display
    )
    problems: list[Problem] = []
    reported: set[tuple[str, str, str | None]] = set()
    float64_ops: dict[str | None, int] = {}
    for rule, op, display, detail in found:
        if rule != "summary" and display.startswith(summary_scopes):
            continue
        layer = scopes.layer_of(display)
        if rule == "dtype":
            # One finding per layer: a float64 constant makes every op after it float64.
            float64_ops[layer] = float64_ops.get(layer, 0) + 1
            if float64_ops[layer] > 1:
                continue
        # The gradient of an op the forward pass already has is the same problem.
        is_gradient = display.split("/", 1)[0] in ("gradient_tape", "gradients")
        if is_gradient and (rule, op.type, layer) in reported:
            continue
        reported.add((rule, op.type, layer))
        problem = _graph_problem(mode, rule, op, display, layer, detail)
        problems.append(dataclasses.replace(problem, op_name=display))
    return problems


def _graph_problem(
    mode: Mode, rule: str, op: tf.Operation, display: str, layer: str | None, detail: Any
) -> Problem:
    where = "{steps}: " + (f"layer {layer}, " if layer else "") + f"op {display}"
    about = f"op '{display}' ({op.type}" + (f", layer {layer}" if layer else "") + ")"
    at = created_at(op)
    created = f" (created at {at})" if at else ""
    if rule == "dynamic-shape":
        return Problem(
            rule,
            ERROR,
            where,
            f"{about} has output shape {shape_text(detail)} in the {{steps}}{created}: "
            "tensors inside a TPU step need static shapes",
            dynamic_fix(op, display),
            mode,
        )
    if rule == "summary":
        return Problem(
            rule,
            ERROR,
            where,
            f"{about} writes a summary inside the replicated {{steps}}{created}: "
            "tf.summary cannot run inside a TPU step",
            "remove the tf.summary call from the model's layers, loss and predictions; "
            "report the value as an eval metric (Model.metrics) instead",
            mode,
        )
    if rule == "dtype":
        return Problem(
            rule,
            ERROR,
            where,
            f"{about} makes float64 tensors inside the {{steps}}{created}: TPUs have no float64",
            "use float32: tf.constant(x, tf.float32), np.float32 arrays, "
            "dtype='float32' for layers and variables, no tf.cast(x, tf.float64)",
            mode,
        )
    return unsupported_problem(mode, about, created, where, op.type)


def trace_failure(name: str, mode: Mode, error: BaseException) -> Problem:
    logging.debug("Building the %s step failed:", STEP_NAMES[mode], exc_info=error)
    message = user_code_line(error)
    if not re.match(r"\w+(Error|Exception|Exit|Interrupt)\b", message):
        message = f"{type(error).__name__}: {message}"
    return Problem(
        "trace",
        ERROR,
        "{steps}",
        f"building and tracing the {{steps}} of {name} failed: {message}",
        "fix the model: `tpurun train/eval/predict` build the same steps and would fail the "
        "same way (rerun with --verbosity=1 for the traceback)",
        mode,
    )
