"""A model_dir's train run records read back without TensorFlow (the supervisor imports none).

`runs/<time>-train.json` on a local disk or gs:// (`tpurun.layout.plain_files`, as
the lease reads it). Each record's time account is checked field by field
(`tpurun.layout.time_account.check`) before it is counted, and so is its `data_service`
field where a tf.data service made its input (`tpurun.layout.served_input.check`,
`Accounts.served`): a record that is not a file, not UTF-8, not JSON, or holds a field
of the wrong type or outside physical bounds is skipped with one line naming the file
and the field (`Accounts.skipped`). A
model_dir or `runs/` that is not a directory is a RunError. Records are written
atomically, so a half-written one is a foreign file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from tpurun.errors import RunError
from tpurun.layout import names, plain_files, served_input, time_account
from tpurun.layout.served_input import ServedInput
from tpurun.layout.time_account import BadField, TimeAccount


@dataclasses.dataclass(frozen=True)
class Accounts:
    """The train records' time accounts that hold, oldest first, and those skipped."""

    found: list[tuple[str, TimeAccount]]  # (the record's file name, its checked account)
    skipped: list[str]  # one line per record not counted: its path, the field, why
    # (file name, its checked `data_service` field) of the records whose input a tf.data
    # service made: how it was made and where a resumed run's input restarted.
    served: list[tuple[str, ServedInput]] = dataclasses.field(default_factory=list)


class _Skip(Exception):
    pass


def _read(path: str) -> bytes | None:
    """A record's bytes (None: gone meanwhile); _Skip when it is no file tpurun wrote."""
    try:
        return plain_files.read_record(path)
    except plain_files.Unreadable as e:
        raise _Skip(str(e)) from None


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
    except ValueError:  # an integer of more digits than Python reads (4,300)
        raise _Skip("holds a number too long to read, not a record") from None


def _listdir(directory: str) -> list[str]:
    try:
        return plain_files.listdir(directory)
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
    """The checked time accounts of model_dir's train records, oldest first.

    A record without one (written before tpurun 0.2) is neither counted nor skipped."""
    directory = names.runs_dir(model_dir)
    found, skipped, served = [], [], []
    for name in sorted(n for n in _listdir(directory) if names.TRAIN_RECORD.fullmatch(n)):
        path = names.join(directory, name)
        try:
            data = _read(path)
            record = _parse(data) if data is not None else None
            if record is None:
                continue
            if not isinstance(record, dict):
                raise _Skip("is not a run record (a JSON object)")
            # Both checked before either is kept: a record that does not hold is skipped whole.
            goodput, service = record.get(time_account.KEY), record.get(served_input.KEY)
            account = None if goodput is None else time_account.check(goodput, now)
            input_served = None if service is None else served_input.check(service)
            if account is not None:
                found.append((name, account))
            if input_served is not None:
                served.append((name, input_served))
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
        found = _listdir(model_dir.rstrip("/"))
    except RunError:
        return None
    steps = [int(m["step"]) for m in map(names.CHECKPOINT_INDEX.fullmatch, found) if m]
    return max(steps, default=None)
