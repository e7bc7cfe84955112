"""The records tpurun keeps in a model_dir, read back: as written, or `DamagedRecord`.

Every record tpurun reads (`train_config.json`, `best/best.json`, the `checkpoint`
state file) goes through here; each caller then recovers (a best set aside, a state
file rebuilt) or fails with one line naming the file, what is wrong and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import tensorflow as tf


class DamagedRecord(Exception):
    """A record that does not read back as what tpurun wrote: `path`, `reason`."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path} is damaged ({reason})")
        self.path = path
        self.reason = reason


def read_text(path: str) -> str | None:
    """The text of a record tpurun wrote; None if there is none; DamagedRecord if not text."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError:
        return None
    except tf.errors.FailedPreconditionError as e:  # a directory where a file should be
        raise DamagedRecord(path, f"not a file: {' '.join(e.message.split())[:100]}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedRecord(
            path, f"not UTF-8 text: byte {e.start} is 0x{data[e.start]:02x}"
        ) from None


def read_json(path: str, keys: Iterable[str] = ()) -> Any:
    """The JSON record at `path` (None if there is none), with `keys` when it is an object."""
    text = read_text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        reason = "empty" if not text.strip() else f"not JSON: {e.msg} at line {e.lineno}"
        raise DamagedRecord(path, reason) from None
    missing = [key for key in keys if not isinstance(value, dict) or key not in value]
    if missing:
        raise DamagedRecord(path, f"no {', '.join(missing)} in it")
    return value
