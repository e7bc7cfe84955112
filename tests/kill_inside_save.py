"""Runs the tpurun CLI, SIGKILLing itself at one point inside the Nth checkpoint save.

    python tests/kill_inside_save.py POINT N train --config=...

POINT is where, inside the save, the process dies:
  merge   the tensors are in ckpt-<step>_temp/, not yet merged into ckpt-<step>.*
  upload  a background save to gs://: ckpt-<step>.data-* uploaded, its .index not yet
  state   ckpt-<step>.* is complete, the `checkpoint` state file not yet rewritten
  delete  the state is rewritten and an old checkpoint's .index deleted, its .data not
(tpurun.storage.checkpoints.Saver writes the state file once per save, then deletes.)
This is what a preemption or an OOM kill can do to a real run, made repeatable.
"""

from __future__ import annotations

import os
import signal
import sys

from tensorflow.python.ops import gen_io_ops

from tpurun import storage
from tpurun.storage import checkpoints
from tpurun.storage.background import checkpoint_upload

point, nth = sys.argv[1], int(sys.argv[2])
calls = {"count": 0}


def dying(original):
    def wrapper(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    return wrapper


if point == "merge":
    gen_io_ops.merge_v2_checkpoints = dying(gen_io_ops.merge_v2_checkpoints)
elif point == "upload":
    original_upload = checkpoint_upload.upload

    def upload(local, target):
        # Dies before the Nth upload of an .index: its .data is uploaded.
        if target.endswith(".index"):
            calls["count"] += 1
            if calls["count"] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        original_upload(local, target)

    checkpoint_upload.upload = upload
elif point == "state":
    checkpoints.write_state = dying(checkpoints.write_state)
elif point == "delete":
    original_remove = storage.remove_file

    def remove_file(model_dir, path, names):
        # Dies on the Nth deletion of a .data file: its .index is already gone.
        if ".data-" in path:
            calls["count"] += 1
            if calls["count"] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        original_remove(model_dir, path, names)

    storage.remove_file = remove_file
else:
    raise SystemExit(f"unknown kill point {point!r}: merge, upload, state or delete")

from tpurun import cli  # noqa: E402 - after the patches, as the CLI imports TensorFlow lazily

sys.exit(cli.main(["tpurun", *sys.argv[3:]]))
