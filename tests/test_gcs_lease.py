"""One trainer per model_dir (tpurun.storage.lease), on a local disk and on gs://.

The trainers here run in this process; a trainer of its own process, signalled, is
tests/test_supervisor.py's (gs://), and real kills are taken over in tests/test_resume.py
(a local disk) and tests/test_gcs_life.py (gs://).
"""

from __future__ import annotations

import json
import os
import time

import pytest
import tensorflow as tf
from conftest import RUN_FAILURE, assert_fails, assert_ok

from tpurun.layout import names
from tpurun.layout.plain_files import GcsObjects
from tpurun.storage import checkpoints, lease

IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10")


# A second trainer refused at once while a trainer of its own process trains on gs://, which
# then, SIGTERMed, releases its lease on the way out: through the supervisor, in
# tests/test_supervisor.py's test_sigterm_to_tpurun_is_one_save_exit_75_and_no_restart.


def test_on_a_local_disk_a_held_lease_refuses_a_second_trainer_at_once(tmp_path, tpurun_cli):
    """The lease held in this process (an flock, per open file: a trainer's own way to
    hold it) refuses a trainer as another process's does, naming this process."""
    model_dir = str(tmp_path / "iris")
    os.makedirs(model_dir)
    held = lease.acquire(model_dir, hang_timeout=300)
    try:
        second = tpurun_cli("train", *IRIS, "--train_steps=100", f"--model_dir={model_dir}")
        line = assert_fails(
            second, RUN_FAILURE, "is being trained by another tpurun train", f"pid {os.getpid()}"
        )
        assert "--force_takeover" in line and "since " in line
        assert lease_exists(f"{model_dir}/{names.LEASE}")  # the refused trainer left it alone
    finally:
        held.release()
    assert not lease_exists(f"{model_dir}/{names.LEASE}")


# A lease a SIGKILLed trainer of this machine left (its pid gone) is taken at once: after
# real kills, by the next trainer, in tests/test_resume.py (a local disk) and
# tests/test_gcs_life.py (gs://), which also see it released at the run's end.


def test_the_lease_is_released_only_after_the_last_background_save_is_written(
    tmp_path, tpurun_cli, monkeypatch
):
    happened = []
    commit, release = checkpoints.Saver.commit, lease._LocalLease.release

    def slow_commit(saver, snapshot):
        time.sleep(0.2)  # a slow bucket: a lease released too early would go before this
        path = commit(saver, snapshot)
        happened.append(("saved", checkpoints.step_of(path)))
        return path

    def recorded_release(held):
        happened.append(("released",))
        release(held)

    monkeypatch.setattr(checkpoints.Saver, "commit", slow_commit)
    monkeypatch.setattr(lease._LocalLease, "release", recorded_release)
    result = tpurun_cli(
        "train", *IRIS, "--train_steps=20", "--save_checkpoints_steps=10", f"--model_dir={tmp_path}"
    )
    assert_ok(result)
    assert "written in the background" in result.stderr
    assert happened == [("saved", 10), ("saved", 20), ("released",)]


def lease_exists(path: str) -> bool:
    """Asked through gcsfs: TensorFlow's stat cache would answer from before a release."""
    if path.startswith("gs://"):
        return GcsObjects().read(path) is not None
    return os.path.exists(path)


def write_lease(path: str, host: str, renewed: float) -> None:
    holder = lease.Holder(host, 1234, "2026-01-01T00:00:00+00:00", renewed, 600.0)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(holder.text())


def test_on_gcs_a_lease_of_another_machine_is_taken_over_only_once_stale(bucket, gcs):
    model_dir = f"{bucket}/iris"
    path = f"{model_dir}/{names.LEASE}"
    write_lease(path, "other-host", time.time() - 60)
    with pytest.raises(lease.LeaseHeld, match="host other-host, pid 1234"):
        lease.acquire(model_dir, hang_timeout=300)
    write_lease(path, "other-host", time.time() - 601)
    held = lease.acquire(model_dir, hang_timeout=300)
    with tf.io.gfile.GFile(path) as f:
        assert json.load(f)["pid"] == os.getpid()
    held.release()
    assert not lease_exists(path)


def test_on_gcs_force_takeover_takes_a_fresh_lease_and_its_holder_then_stops(bucket, gcs):
    model_dir = f"{bucket}/iris"
    first = lease.acquire(model_dir, hang_timeout=300)
    second = lease.acquire(model_dir, hang_timeout=300, force=True)
    first._renewed = 0.0  # due for renewal: it finds the lease replaced
    with pytest.raises(lease.RunError, match="took over the lease"):
        first.renew()
    first.release()  # must not remove the new holder's lease
    assert lease_exists(f"{model_dir}/{names.LEASE}")
    second.release()


def test_renewal_makes_a_request_at_most_once_a_minute(bucket, gcs):
    held = lease.acquire(f"{bucket}/iris", hang_timeout=300)
    with gcs.counting() as log:
        for _ in range(100):
            held.renew()
    assert len(log) == 0
    held._renewed -= lease.RENEW_SECONDS
    with gcs.counting() as log:
        held.renew()
    assert log.kinds() == {"upload": 1}
    held.release()


def test_a_lease_the_storage_refuses_is_one_line_with_the_fix(bucket, gcs, tpurun_cli):
    gcs.fail(403, kind="upload", path="uploadType=multipart", times=None)  # the lease's writes
    result = tpurun_cli("train", *IRIS, "--train_steps=10", f"--model_dir={bucket}/iris")
    assert_fails(
        result, RUN_FAILURE, "cannot take the lease", "permission denied", "storage.objectAdmin"
    )
