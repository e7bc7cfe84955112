"""Runs the tpurun CLI, SIGKILLing itself at one point inside the Nth checkpoint save.

    python tests/kill_inside_save.py POINT N train --config=...

POINT is where, inside the save, the process dies:
  merge   the tensors are in ckpt-<step>_temp/, not yet merged into ckpt-<step>.*
  state   ckpt-<step>.* is complete, the `checkpoint` state file not yet rewritten
  delete  the state is rewritten and an old checkpoint's .index deleted, its .data not
This is what a preemption or an OOM kill can do to a real run, made repeatable.
"""

from __future__ import annotations

import os
import signal
import sys

from tensorflow.python.checkpoint import checkpoint_management
from tensorflow.python.ops import gen_io_ops

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
elif point == "state":
    checkpoint_management.update_checkpoint_state_internal = dying(
        checkpoint_management.update_checkpoint_state_internal
    )
elif point == "delete":
    original_delete = checkpoint_management._delete_file_if_exists

    def delete(filespec):
        # Dies on the Nth deletion of a .data file: its .index is already gone.
        if ".data-" in filespec:
            calls["count"] += 1
            if calls["count"] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        original_delete(filespec)

    checkpoint_management._delete_file_if_exists = delete
else:
    raise SystemExit(f"unknown kill point {point!r}: merge, state or delete")

from tpurun import cli  # noqa: E402 - after the patches, as the CLI imports TensorFlow lazily

sys.exit(cli.main(["tpurun", *sys.argv[3:]]))
