"""Runs the tpurun CLI with every checkpoint write slowed down, so that saves stay in flight.

    python tests/slow_saves.py SECONDS train --config=...

Writing a checkpoint's tensors and merging them each wait SECONDS first, as a
slow bucket would make them; a background save (config.train.async_checkpoint)
is then being written while training goes on, and a kill at a random moment
lands inside one (tests/test_resume.py). The slowness is a fixed sleep, not the
machine's speed.
"""

from __future__ import annotations

import sys
import time

from tensorflow.python.ops import gen_io_ops, io_ops

seconds = float(sys.argv[1])


def slowed(original):
    def wrapper(*args, **kwargs):
        time.sleep(seconds)
        return original(*args, **kwargs)

    return wrapper


io_ops.save_v2 = slowed(io_ops.save_v2)
gen_io_ops.merge_v2_checkpoints = slowed(gen_io_ops.merge_v2_checkpoints)

from tpurun import cli  # noqa: E402 - after the patches, as the CLI imports TensorFlow lazily

sys.exit(cli.main(["tpurun", *sys.argv[2:]]))
