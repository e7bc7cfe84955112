"""A background save's files, on gs:// written on the local disk first, then uploaded: `write`.

TensorFlow's save writes each file of a checkpoint to a temporary and renames
it, then merges its shards from a `ckpt-<step>_temp/` directory: on Cloud
Storage a rename is a copy and a delete, and a save made 33 requests in a row
(`scripts/gcs_requests.py`), 2 s at a bucket's 60 ms each, every one a TLS
connection whose CPU a small host takes from training. An object upload is
atomic by itself (the object appears whole or not at all), so here the
checkpoint is written to a local directory and its files uploaded in place,
the data first and the `.index` last: as with TensorFlow's own save, the
checkpoint exists once its `.index` does. A kill in between leaves a `.data`
without its `.index`, which the next run removes
(`checkpoints.remove_partial_saves`). 4 requests and no copy.

Only where the tensors are on this process's host (a single-process run: CPU,
GPUs, a TPU VM's chips): the write runs where the tensors are, and another
host's local disk is not this one's. The local directory is in the system's
temporary directory (TMPDIR), removed after the upload; one a killed run left
is removed by the first staged save of the next run on this machine. A local write that fails
(the local disk full) is logged and the checkpoint written to gs:// directly.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun import storage, tf_internals
from tpurun.layout import names

# tpurun-ckpt-<pid>-<random>: the pid says whether the run that made it is still alive.
_STAGING = re.compile(r"tpurun-ckpt-(?P<pid>\d+)-[a-z0-9_]+")
_LOCAL_PREFIX = "ckpt"
_CHUNK = 64 << 20
_SWEPT: set[str] = set()  # the temporary directories this process cleared of dead runs' staging


def write(copy: Any, prefix: str) -> None:
    """Writes a `tf_internals.host_copy` as the checkpoint `prefix`: for gs:// through a local
    directory where it can (`upload_via_local_disk`), else as `Checkpoint.write` does."""
    if not upload_via_local_disk(copy, prefix):
        tf_internals.write_host_copy(copy, prefix)


def upload_via_local_disk(copy: Any, prefix: str) -> bool:
    """Writes a `tf_internals.host_copy` as the gs:// checkpoint `prefix` through a local
    directory; False (nothing written) where that does not apply or the local write failed."""
    if not prefix.startswith("gs://") or not _on_this_host(copy):
        return False
    _remove_dead_runs_staging()
    directory = tempfile.mkdtemp(prefix=f"tpurun-ckpt-{os.getpid()}-")
    try:
        local = os.path.join(directory, _LOCAL_PREFIX)
        try:
            tf_internals.write_host_copy(copy, local)
        except (tf.errors.OpError, OSError) as e:
            logging.warning(
                "Could not write the checkpoint to the local disk first (%s); writing it to %s "
                "directly.",
                storage.failure(e),
                prefix,
            )
            return False
        files = [f for f in os.listdir(directory) if names.is_file_of(_LOCAL_PREFIX, f)]
        data = sorted(f for f in files if not names.is_index(f))
        for name in [*data, names.index_file(_LOCAL_PREFIX)]:  # the .index last: it completes it
            upload(os.path.join(directory, name), prefix + name[len(_LOCAL_PREFIX) :])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return True


def upload(local: str, target: str) -> None:
    """One file, uploaded in place (no temporary: an upload is atomic on gs://), in chunks.
    Not `tf.io.gfile.copy`, which asks for the target first: a request more."""
    with open(local, "rb") as source, tf.io.gfile.GFile(target, "wb") as f:
        while chunk := source.read(_CHUNK):
            f.write(chunk)


def _on_this_host(copy: Any) -> bool:
    for device in tf_internals.host_copy_devices(copy):
        job = tf.DeviceSpec.from_string(device).job if device else None
        if job not in (None, "localhost"):
            return False
    return True


def _remove_dead_runs_staging() -> None:
    """Removes the staging directories of runs of this machine that were killed mid-save:
    once per process (the runs that die while it trains leave theirs to the next run)."""
    root = tempfile.gettempdir()
    if root in _SWEPT:
        return
    _SWEPT.add(root)
    try:
        entries = os.listdir(root)
    except OSError:
        return
    for name in entries:
        match = _STAGING.fullmatch(name)
        path = os.path.join(root, name)
        if match and not storage.process_alive(int(match["pid"])) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
