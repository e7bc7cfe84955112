"""The run record of a trainer that died before it wrote its own, written by its supervisor.

A trainer writes its record once it has built its model (`tpurun.commands`); one
killed earlier (in TensorFlow's import, on a preempted TPU) leaves none, and
`tpurun report` would miss its death and its restart. Its supervisor knows when it
started it, the death it told it of, when it died and how: it writes that record
itself, named by the trainer's start (`runs/<start>-train.json`), only into a
model_dir's existing `runs/` (never through a symbolic link: a trainer that made no
model_dir made nothing to account for there), and never over a file. Its temporary
has `tpurun.storage`'s form, so the next train removes one a kill left.
TensorFlow-free, as the supervisor is: a local disk, or gs:// through gcsfs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from typing import Any

from tpurun.report import run_records

# As `tpurun.storage` names this machine in its temporaries (which this module, free of
# TensorFlow, cannot import).
_HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"


def write(model_dir: str, goodput: dict[str, Any], cause: str) -> str | None:
    """Writes a run record holding `goodput` for a trainer that left none; its path, or None
    where there is no runs/ directory to write it into (or it could not be written)."""
    goodput = {**goodput, "unrecorded": f"{cause}; recorded by its supervisor"}
    text = json.dumps({"run_config": None, "goodput": goodput}, indent=2) + "\n"
    runs = model_dir.rstrip("/") + "/" + run_records.RUNS
    path = f"{runs}/{run_records.record_name('train', float(goodput['process_start']))}"
    try:
        if runs.startswith("gs://"):
            fs = run_records.gcs()
            if not fs.exists(path):  # an object upload is atomic by itself
                fs.pipe(path, text.encode())
            return path
        if os.path.islink(runs) or not os.path.isdir(runs):
            return None
        name = os.path.basename(path)
        temporary = f"{runs}/.{name}.tpurun-tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o644), "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(temporary, path)  # never over a file that is there
        finally:
            os.unlink(temporary)
    except Exception:  # noqa: BLE001 - an account is no reason to fail the job
        return None
    return path
