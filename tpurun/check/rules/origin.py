"""Where an op of a traced step comes from: the file:line of the user's own code that made it."""

from __future__ import annotations

import tensorflow as tf

from tpurun.errors.user_code import in_text, is_user_file, relative


def created_at(op: tf.Operation) -> str | None:
    """file:line of the innermost frame of the model's own code that created `op`."""
    try:
        frames = list(op.traceback)
    except Exception:  # noqa: BLE001 - tracebacks are a nicety
        return None
    for frame in reversed(frames):
        if is_user_file(frame.filename):
            return f"{relative(frame.filename)}:{frame.lineno}"
    return None


def created_at_from_text(text: str) -> str | None:
    """The innermost user frame of the "The op is created at:" trace in an XLA error."""
    if "The op is created at" not in text:
        return None
    return in_text(text.split("The op is created at")[1])
