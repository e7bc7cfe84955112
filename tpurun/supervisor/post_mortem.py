"""The run record of a trainer that died before it wrote its own, written by its supervisor.

A trainer writes its record once it has built its model (`tpurun.commands`); one
killed earlier (in TensorFlow's import, on a preempted TPU) leaves none, and
`tpurun report` would miss its death and its restart. Its supervisor knows when it
started it, the death it told it of, when it died and how: it writes that record
itself, named by the trainer's start (`runs/<start>-train.json`), only into a
model_dir's existing `runs/` (never through a symbolic link: a trainer that made no
model_dir made nothing to account for there), and never over a file
(`tpurun.layout.plain_files.create_new`: a temporary the next train removes if a kill
left it). TensorFlow-free, as the supervisor is: a local disk, or gs:// through gcsfs.
"""

from __future__ import annotations

import dataclasses

from tpurun.layout import names, plain_files, time_account
from tpurun.layout.time_account import TimeAccount


def write(model_dir: str, account: TimeAccount, cause: str) -> str | None:
    """Writes a run record holding `account` for a trainer that left none; its path, or None
    where there is no runs/ directory to write it into (or it could not be written)."""
    account = dataclasses.replace(account, unrecorded=f"{cause}; recorded by its supervisor")
    text = time_account.record_text({"run_config": None, time_account.KEY: account})
    name = names.run_record_name("train", float(account.process_start))
    path = names.join(names.runs_dir(model_dir), name)
    return path if plain_files.create_new(path, text) else None
