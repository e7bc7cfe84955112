"""A model_dir's train run records read back without TensorFlow (the supervisor imports none).

`runs/<time>-train.json` on a local disk or gs:// (through gcsfs, as the lease reads
it). Each record's time account is checked field by field (`validation`) before it is
counted: a record that is not a file, not UTF-8, not JSON, or holds a field of the
wrong type or outside physical bounds is skipped with one line naming the file and
the field (`Accounts.skipped`). A model_dir or `runs/` that is not a directory is a
RunError. Records are written atomically, so a half-written one is a foreign file.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging as std_logging
import os
import re
import stat
import time
from typing import Any

from tpurun.errors import RunError
from tpurun.report.validation import BadField, check

RUNS = "runs"
TRAIN_RECORD = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-train\.json$")
# A record is a few kB (a save adds ~80 bytes): anything this large is not one.
MAX_RECORD_BYTES = 64 << 20
_CHECKPOINT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


@dataclasses.dataclass(frozen=True)
class Accounts:
    """The train records' time accounts that hold, oldest first, and those skipped."""

    found: list[tuple[str, dict[str, Any]]]  # (the record's file name, its checked `goodput`)
    skipped: list[str]  # one line per record not counted: its path, the field, why
    # (file name, `data_service`) of the records whose input a tf.data service made: how
    # it was made and where a resumed run's input restarted (tpurun.data_service.job).
    served: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)


def record_name(command: str, at: float | None = None) -> str:
    """A run record's name: `<UTC time to the microsecond>-<command>.json`, of now or of
    `at` (epoch seconds); TRAIN_RECORD matches a train's."""
    moment = datetime.datetime.fromtimestamp(
        time.time() if at is None else at, datetime.timezone.utc
    )
    return f"{moment.strftime('%Y%m%dT%H%M%S.%fZ')}-{command}.json"


class _Skip(Exception):
    pass


def gcs() -> Any:
    import gcsfs  # only for gs:// model_dirs: it brings aiohttp

    std_logging.getLogger("gcsfs").setLevel(std_logging.CRITICAL)
    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    return gcsfs.GCSFileSystem(token="anon" if emulated else None)


def _read(path: str) -> bytes | None:
    """A record's bytes (None: gone meanwhile); _Skip when it is no file tpurun wrote."""
    try:
        if path.startswith("gs://"):
            with gcs().open(path, "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
        else:
            kind = stat.S_IFMT(os.stat(path).st_mode)  # through a link: what a read reaches
            if kind != stat.S_IFREG:  # a pipe would block the read for ever
                raise _Skip(f"is {_KINDS.get(kind, 'not a regular file')}, not a record")
            with open(path, "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Skip(f"cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_RECORD_BYTES:
        raise _Skip(f"is larger than {MAX_RECORD_BYTES >> 20} MiB, not a record")
    return data


def _parse(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Skip(f"is not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _Skip(f"is not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise _Skip("is nested too deeply to be a record") from None


def _listdir(directory: str) -> list[str]:
    if directory.startswith("gs://"):
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in gcs().ls(directory, refresh=True)]
        except FileNotFoundError:
            return []
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        model_dir = os.path.dirname(directory)
        if not os.path.isdir(model_dir):
            raise RunError(
                f"--model_dir={model_dir} is a file, not a directory; give the model_dir "
                "that tpurun train wrote"
            ) from None
        raise RunError(
            f"{directory} is a file, not the directory of run records tpurun keeps there; "
            "move it away (the next train makes the directory again)"
        ) from None
    except OSError as e:
        raise RunError(f"cannot list {directory}: {e.strerror or e}") from None


def time_accounts(model_dir: str, now: float | None = None) -> Accounts:
    """The checked time accounts (`goodput`) of model_dir's train records, oldest first.

    A record without one (written before tpurun 0.2) is neither counted nor skipped."""
    directory = model_dir.rstrip("/") + "/" + RUNS
    found, skipped, served = [], [], []
    for name in sorted(n for n in _listdir(directory) if TRAIN_RECORD.match(n)):
        path = directory + "/" + name
        try:
            data = _read(path)
            record = _parse(data) if data is not None else None
            if record is None:
                continue
            if not isinstance(record, dict):
                raise _Skip("is not a run record (a JSON object)")
            if record.get("goodput") is not None:
                found.append((name, check(record["goodput"], now)))
            if isinstance(record.get("data_service"), dict):
                served.append((name, record["data_service"]))
        except _Skip as e:
            skipped.append(f"{path} {e}")
        except BadField as e:
            skipped.append(f"{path}: {e}")
    return Accounts(found, skipped, served)


def newest_checkpoint_step(model_dir: str) -> int | None:
    """The step of the newest checkpoint whose `.index` is in model_dir: the one a trainer
    resumes from (`tpurun.storage.checkpoints.candidates`, which also checks it reads back whole);
    None if there is none or model_dir cannot be listed."""
    try:
        names = _listdir(model_dir.rstrip("/"))
    except RunError:
        return None
    steps = [int(m.group(1)) for m in map(_CHECKPOINT_INDEX.match, names) if m]
    return max(steps, default=None)
