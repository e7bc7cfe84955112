"""Reads a gs:// model_dir's state twice in one tpurun process; the test changes it in between.

    python tests/reads_again.py MODEL_DIR

Imports tpurun before TensorFlow, as the `tpurun` command does, so that TensorFlow's GCS file
system is made with tpurun's settings; then reads what a resume and a sidecar read
(whether `ckpt-60_temp/` is a directory, the checkpoints of the `checkpoint` state
file, through sidecar.StateWatch) and prints it as one JSON line, waits for a line
on stdin (the test removes the directory and saves ckpt-60 meanwhile), and prints
what the same reads find then.
"""

from __future__ import annotations

import gc
import json
import os
import sys

from tpurun import storage

# tpurun's __init__ runs before these modules import TensorFlow, as in the tpurun command.
from tpurun.runners import sidecar

# What the imports made (TensorFlow's and Keras's modules: most of this process's objects)
# is left out of the garbage collector's scans, as tests/conftest.py does in the test
# processes: the last scan, at exit, was ~1.6 of this script's ~7 CPU-seconds. What the
# reads make is collected as before.
gc.freeze()

model_dir = sys.argv[1]
watch = sidecar.StateWatch(model_dir)


def read() -> dict:
    return {
        "cache_age": os.environ.get("GCS_STAT_CACHE_MAX_AGE"),
        "temp_dir": storage.isdir(f"{model_dir}/ckpt-60_temp"),
        "checkpoints": [storage.basename(path) for path in watch.saved_checkpoints()],
    }


print(json.dumps(read()), flush=True)
sys.stdin.readline()
print(json.dumps(read()), flush=True)
