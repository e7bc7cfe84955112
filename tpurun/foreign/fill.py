"""A plan's values read in one pass and put into the model's variables.

Every taken tensor is read by one RestoreV2 op: TensorFlow's reader sorts the keys,
so a .data file is read front to back once, never a request per variable (each costs
tens of milliseconds on gs://), and nothing of the source but its taken tensors: an
optimizer's slots, often twice the weights, are not read at all. Nothing is assigned
until every value was read, so a read that fails (a truncated .data, a file gone
from gs:// midway) leaves the model as it was built.
"""

from __future__ import annotations

import tensorflow as tf

from tpurun.foreign.plan import Plan
from tpurun.foreign.sources import SourceVariable, read_failure


def read(prefix: str, variables: list[SourceVariable], flag: str, given: str) -> list[tf.Tensor]:
    """The values of `variables` in checkpoint `prefix`, read on the host in one op."""
    if not variables:
        return []
    try:
        with tf.device("CPU:0"):
            return list(
                tf.raw_ops.RestoreV2(
                    prefix=prefix,
                    tensor_names=[v.key for v in variables],
                    shape_and_slices=[""] * len(variables),
                    dtypes=[v.dtype for v in variables],
                )
            )
    except (tf.errors.OpError, ValueError, IndexError) as e:
        raise read_failure(flag, given, e, f"{prefix}.data") from None


def fill(plan: Plan, flag: str) -> None:
    """Reads the plan's taken values and assigns them (reshaped where its rule says so)."""
    source = plan.source
    values = read(source.prefix, [t.source for t in plan.taken], flag, source.given)
    for taken, value in zip(plan.taken, values, strict=True):
        if taken.reshape:
            value = tf.reshape(value, taken.target.shape)
        taken.target.assign(value)
