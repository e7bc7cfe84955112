"""Where an op of a traced step comes from: the file:line of the user's own code that made it."""

from __future__ import annotations

import os
import re

import tensorflow as tf

# tpurun's own files (the launcher, this package) are not the user's.
_TPURUN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def is_user_file(filename: str) -> bool:
    path = filename if filename.startswith(os.sep) else os.sep + filename
    if any(marker in path for marker in _LIBRARY_MARKERS) or path.startswith(os.sep + "<"):
        return False
    if path.startswith(_TPURUN_ROOT + os.sep) or "/lib/python3" in path:
        return False
    return True


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
    frames = re.findall(r'File "([^"]+)", line (\d+)', text.split("The op is created at")[1])
    for filename, line in reversed(frames):
        if is_user_file(filename):
            path = filename if filename.startswith(os.sep) else os.sep + filename
            return f"{relative(path)}:{line}"
    return None


def relative(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path
