"""How long saving and restoring the mnist model's checkpoint takes on gs:// against a local disk.

    .venv/bin/python scripts/gcs_save_restore_times.py [--repeats 5]

The default mnist config's model and Adam state (a checkpoint of ~5 MB), saved as
`tpurun train` saves (tpurun.storage.checkpoints.Saver; on gs:// also with TensorFlow's
CheckpointManager, which tpurun used before, for comparison), and read back whole
as a resume does. gs:// is the test GCS server (tests/fake_gcs: fake-gcs-server behind a
loopback proxy): its times are the cost of the requests and of the proxy on this
machine, without a real network's latency, so read them as a lower bound and
compare them with the requests each operation makes (also printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from fake_gcs.server import GcsServer  # noqa: E402 - after the path set-up above
from offline_env import OFFLINE_ENV  # noqa: E402 - scripts/offline_env.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(OFFLINE_ENV)
    with tempfile.TemporaryDirectory() as tmp, GcsServer(Path(tmp)) as gcs:
        os.environ.update(gcs.env)  # before TensorFlow reads its GCS settings
        import keras
        import tensorflow as tf

        from tpurun import model as model_lib
        from tpurun.run_config import config_files, merge_flags
        from tpurun.storage import checkpoints

        config = merge_flags(config_files.load(config_files.resolve("mnist")), {})
        keras_model = model_lib.build_keras_model(model_lib.create(config))
        optimizer = keras.optimizers.Adam()
        optimizer.build(keras_model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=keras_model, optimizer=optimizer)
        bucket = gcs.make_bucket("times")
        print(
            f"{'where':<40}{'save (s)':>10}{'restore (s)':>13}{'requests/save':>15}{'/restore':>10}"
        )
        runs = (
            ("local", f"{tmp}/mnist", checkpoints.Saver),
            ("gs://", f"{bucket}/mnist", checkpoints.Saver),
            ("gs:// (TensorFlow's CheckpointManager)", f"{bucket}/manager", _ManagerSaver),
        )
        for where, directory, make_saver in runs:
            saver = make_saver(checkpoint, directory, keep_checkpoint_max=3)
            saves, restores = [], []
            for step in range(1, args.repeats + 1):
                with gcs.counting() as save_log:
                    started = time.perf_counter()
                    path = saver.save(step)
                    saves.append(time.perf_counter() - started)
                with gcs.counting() as restore_log:
                    started = time.perf_counter()
                    checkpoint.read(path).assert_existing_objects_matched()
                    restores.append(time.perf_counter() - started)
            size = sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(path + ".*"))
            print(
                f"{where:<40}{statistics.median(saves):>10.3f}{statistics.median(restores):>13.3f}"
                f"{len(save_log):>15}{len(restore_log):>10}   ({size / 1e6:.1f} MB, "
                f"median of {args.repeats})"
            )


class _ManagerSaver:
    """TensorFlow's CheckpointManager behind the Saver's interface."""

    def __init__(self, checkpoint, directory: str, keep_checkpoint_max: int):
        import tensorflow as tf

        self._manager = tf.train.CheckpointManager(
            checkpoint, directory, max_to_keep=keep_checkpoint_max
        )

    def save(self, step: int) -> str:
        return self._manager.save(checkpoint_number=step)


if __name__ == "__main__":
    main()
