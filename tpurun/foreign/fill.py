"""A plan's values, and the source's step, read in one pass and put into the model's variables.

The taken tensors are read by the CheckpointReader that read the .index (not a second
reader, which would read the .index again), in the order of their keys, which is the
order of the data: the .data file is read front to back once, in as many requests as
its read-ahead buffer takes (TensorFlow's GCS client: 64 MB each by default), never a
request per variable (each costs tens of milliseconds on gs://). Nothing is assigned
until every value was read, so a read that fails (a truncated .data, a file gone from
gs:// midway) leaves the model as it was built.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tpurun.foreign.plan import Plan
from tpurun.foreign.sources import Source, SourceVariable, read_failure


def read(source: Source, variables: list[SourceVariable]) -> list[np.ndarray]:
    """The values of `variables` of `source`, read by the reader that read its .index, in
    the order of their keys: the order of the data (a bundle is written sorted by key), so
    the .data file is read front to back once, through the file's read-ahead buffer."""
    by_key = sorted(variables, key=lambda v: v.key)
    try:
        values = {v.key: source.reader.get_tensor(v.key) for v in by_key}
    except (tf.errors.OpError, ValueError, IndexError) as e:
        raise read_failure(source.flag, source.given, e, f"{source.prefix}.data") from None
    return [values[v.key] for v in variables]


def fill(plan: Plan) -> int | None:
    """Reads the plan's taken values, with the step the source was saved at, in one pass;
    assigns them (reshaped where the rule says so); returns that step (None: it says none)."""
    source = plan.source
    step_variable = source.step_variable()
    wanted = [t.source for t in plan.taken] + ([step_variable] if step_variable else [])
    values = read(source, wanted)
    for taken, value in zip(plan.taken, values, strict=False):
        if taken.reshape:
            value = tf.reshape(value, taken.target.shape)
        taken.target.assign(value)
    return int(values[-1]) if step_variable else source.step_in_name()
