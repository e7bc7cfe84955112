"""A model_dir's train run records read back without TensorFlow (the supervisor imports none).

`runs/<time>-train.json` on a local disk or gs:// (through gcsfs, as the lease reads
it). A record that does not read back (half-written by a process killed in a write:
records are written atomically, so only a foreign file) is skipped with its reason.
"""

from __future__ import annotations

import json
import logging as std_logging
import os
import re
from typing import Any

RUNS = "runs"
TRAIN_RECORD = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-train\.json$")
_CHECKPOINT = re.compile(r'^model_checkpoint_path:\s*"([^"]*)"', re.MULTILINE)


def _gcs() -> Any:
    import gcsfs  # only for gs:// model_dirs: it brings aiohttp

    std_logging.getLogger("gcsfs").setLevel(std_logging.CRITICAL)
    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    return gcsfs.GCSFileSystem(token="anon" if emulated else None)


def _read(path: str) -> str | None:
    try:
        if path.startswith("gs://"):
            with _gcs().open(path, "rb") as f:
                return f.read().decode("utf-8")
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _listdir(directory: str) -> list[str]:
    try:
        if directory.startswith("gs://"):
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in _gcs().ls(directory, refresh=True)]
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def train_records(model_dir: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, record) of every train run record in model_dir, oldest first."""
    directory = model_dir.rstrip("/") + "/" + RUNS
    found = []
    for name in sorted(n for n in _listdir(directory) if TRAIN_RECORD.match(n)):
        text = _read(directory + "/" + name)
        try:
            record = json.loads(text) if text else None
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            found.append((name, record))
    return found


def latest_checkpoint_step(model_dir: str) -> int | None:
    """The step of the checkpoint the `checkpoint` state file names newest; None if none."""
    text = _read(model_dir.rstrip("/") + "/checkpoint")
    match = _CHECKPOINT.search(text or "")
    if not match:
        return None
    step = re.search(r"ckpt-(\d+)$", match.group(1))
    return int(step.group(1)) if step else None
