"""tpurun.storage.background: the run's writer thread, TensorBoard events staged in memory, and what
goes through the writer (the lease's renewal, a worker's part in a background save).

No test waits on the wall clock: the writer's thread is held by a job that waits for an
event the test sets (`held`), and the events' cadence reads a FakeClock.
"""

from __future__ import annotations

import tempfile
import threading

import pytest
import tensorflow as tf
from conftest import capture_info_logs
from fakes import FakeClock
from iris_runs import iris_run

from tpurun import tf_internals
from tpurun.actions.base import LoopStats
from tpurun.actions.lease_renewal import RenewLease
from tpurun.errors import RunError
from tpurun.storage.background import Writer, checkpoint_upload, events
from tpurun.storage.background.events import StagedEvents
from tpurun.storage.lease import Lease


def held(writer: Writer) -> threading.Event:
    """Holds the writer's thread until the returned event is set: what is handed to it waits."""
    gate = threading.Event()
    writer.submit(lambda: gate.wait(60))
    return gate


# --- Writer --------------------------------------------------------------------------------


def test_the_writer_runs_work_in_order_and_gives_results_and_errors_through_futures():
    done: list[str] = []
    with Writer() as writer:
        gate = held(writer)
        first = writer.submit(lambda: done.append("first") or 1)
        failing = writer.submit(lambda: 1 / 0)
        last = writer.submit(lambda: done.append("last") or 3)
        assert not first.done(), "handed over, not run: the thread is held"
        gate.set()
        assert last.result(timeout=60) == 3
    assert first.result() == 1 and done == ["first", "last"]
    with pytest.raises(ZeroDivisionError):
        failing.result()


def test_a_write_still_waiting_takes_the_newest_data_in_its_place(tmp_path):
    written: list[str] = []
    with Writer() as writer:
        gate = held(writer)
        for version in ("v1", "v2", "v3"):
            writer.write(str(tmp_path / "record.json"), version)
        writer.submit(lambda: written.append((tmp_path / "record.json").read_text()))
        writer.write(str(tmp_path / "events"), b"\x00bytes")
        gate.set()
        writer.flush()
        assert written == ["v3"], "one write, of the newest data, before what came after it"
        assert (tmp_path / "events").read_bytes() == b"\x00bytes"
    writer.flush()  # closed: nothing to wait for


def test_a_failed_write_is_logged_not_raised_and_the_next_write_of_it_tries_again(tmp_path, caplog):
    capture_info_logs(caplog)
    record = tmp_path / "runs" / "record.json"
    with Writer() as writer:
        writer.write(str(record), "lost")  # its directory is not there
        writer.flush()
        record.parent.mkdir()
        writer.write(str(record), "kept")
    assert record.read_text() == "kept"
    assert any(f"Could not write {record}" in m for m in caplog.messages), caplog.messages


# --- StagedEvents: TensorBoard events uploaded off the loop --------------------------------


def loss_events(staged: StagedEvents, clock: FakeClock, steps: range) -> None:
    """Host loops of 10 fake seconds, each writing a loss."""
    for step in steps:
        with staged.summary_writer.as_default(step=step):
            tf.summary.scalar("loss", 1.0 / step)
        staged.wrote()
        clock.advance(10)
        staged.after_loop()


def test_staged_events_upload_at_their_cadence_and_rotate_files_so_bytes_grow_linearly(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(events, "UPLOADS_PER_FILE", 3)
    clock, uploads = FakeClock(), []

    class Recording(Writer):
        def write(self, path, data):
            uploads.append((path.rsplit("/", 1)[1], len(data)))
            super().write(path, data)

    with Recording() as writer:
        staged = StagedEvents(str(tmp_path), writer, upload_secs=30, clock=clock.monotonic)
        loss_events(staged, clock, range(1, 101))  # 100 loops: an upload every 3
        staged.close()
    names = [name for name, _ in uploads]
    assert len(names) == 34  # every 30 fake seconds, and the rest at the end
    assert names == sorted(names), "files sort in the order they were made (TensorBoard's)"
    assert len(set(names)) == 12, "a new file after every 3 uploads"
    on_disk = sorted(p.name for p in tmp_path.iterdir())
    assert on_disk == sorted(set(names))
    written = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert sum(size for _, size in uploads) <= 3 * written  # each byte up at most 3 times
    steps = [
        event.step
        for path in sorted(tmp_path.iterdir())
        for event in tf.compat.v1.train.summary_iterator(str(path))
        if event.summary.value
    ]
    assert steps == list(range(1, 101)), "every loop's scalar, once, in order"


def test_staged_events_before_the_cadence_go_up_at_close_only(tmp_path):
    clock = FakeClock()
    with Writer() as writer:
        staged = StagedEvents(str(tmp_path), writer, upload_secs=1e6, clock=clock.monotonic)
        loss_events(staged, clock, range(1, 4))
        writer.flush()
        assert list(tmp_path.iterdir()) == []
        staged.close()
    [events_file] = tmp_path.iterdir()
    assert "tfevents" in events_file.name


# --- RenewLease: the lease renewed through the writer ---------------------------------------


class DueLease(Lease):
    """A lease always due for renewal, whose renewal waits for `gate` and can be lost."""

    def __init__(self) -> None:
        self.renewals, self.lost = 0, False
        self.gate = threading.Event()

    def renew_due(self) -> bool:
        return True

    def renew(self) -> None:
        self.gate.wait(60)
        self.renewals += 1
        if self.lost:
            raise RunError("another trainer took over the lease")


STATS = LoopStats(
    step=10, num_steps=10, loss=0.5, seconds=1.0, input_seconds=0.0, global_batch=32,
    learning_rate=0.1,
)  # fmt: skip


def test_the_lease_is_renewed_in_the_background_one_renewal_at_a_time():
    lease = DueLease()
    with Writer() as writer:
        renew = RenewLease(lease, writer)
        for _ in range(3):  # the renewal waits for its request: loops do not
            renew.after_loop(STATS)
        lease.gate.set()
        writer.flush()
        assert lease.renewals == 1, "one renewal in flight at a time"
        renew.after_loop(STATS)  # the answer is in: the next is handed over
        writer.flush()
    assert lease.renewals == 2


def test_a_lease_lost_in_the_background_ends_the_run_at_a_later_loop():
    lease = DueLease()
    lease.lost = True
    lease.gate.set()
    with Writer() as writer:
        renew = RenewLease(lease, writer)
        renew.after_loop(STATS)
        writer.flush()
        with pytest.raises(RunError, match="another trainer took over the lease"):
            renew.after_loop(STATS)


# --- a worker's part in a background save ----------------------------------------------------


def test_a_worker_other_than_the_chief_only_reads_the_state_in_the_background_mode(tmp_path):
    from tpurun.actions.save import SaveCheckpoint
    from tpurun.cluster import Cluster

    cluster = Cluster(tf.distribute.get_strategy(), "test", is_chief=False, task="worker-1")
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    with Writer() as writer:
        save = SaveCheckpoint(iris_run(tmp_path), checkpoint, cluster, writer)
        assert save(10) == str(tmp_path / "ckpt-10")  # where the chief's copy is
        assert save.wait() == []
    assert not list(tmp_path.glob("ckpt-*")) and not list(tmp_path.glob(".scratch/*"))
    assert int(checkpoint.save_counter) == 1  # counted as the chief counts


# --- A background save to gs:// through the local disk --------------------------------------


def host_copy_of(values: list[float]) -> tuple[tf.train.Checkpoint, object]:
    checkpoint = tf.train.Checkpoint(weights=tf.Variable(values))
    copy = tf_internals.host_copy(checkpoint)
    assert copy is not None
    return checkpoint, copy


def test_a_background_save_to_gcs_is_written_locally_then_uploaded_in_four_requests(
    bucket, gcs, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, copy = host_copy_of([1.0, 2.0, 3.0])
    with gcs.counting() as log:
        checkpoint_upload.write(copy, f"{bucket}/ckpt-5")
    # Two objects, each a resumable upload (start, then the bytes), the .index last; no
    # temporary, copy or delete, where TensorFlow's own save made 33 requests.
    assert [(r.kind, r.object) for r in log] == [
        ("upload", "ckpt-5.data-00000-of-00001"),
        ("upload", "ckpt-5.data-00000-of-00001"),
        ("upload", "ckpt-5.index"),
        ("upload", "ckpt-5.index"),
    ]
    restored = tf.train.Checkpoint(weights=tf.Variable([0.0, 0.0, 0.0]))
    restored.read(f"{bucket}/ckpt-5").assert_consumed()
    assert restored.weights.numpy().tolist() == [1.0, 2.0, 3.0]
    assert list(tmp_path.iterdir()) == []  # the local directory removed


def test_a_failed_local_write_is_logged_and_the_save_goes_to_gcs_directly(
    bucket, tmp_path, monkeypatch, caplog
):
    capture_info_logs(caplog)
    local_disk_full = tmp_path / "full"
    local_disk_full.write_text("a file, not a directory: nothing can be written under it")
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(local_disk_full / prefix))
    _, copy = host_copy_of([4.0])
    checkpoint_upload.write(copy, f"{bucket}/ckpt-7")
    assert "writing it to gs://" in caplog.text
    restored = tf.train.Checkpoint(weights=tf.Variable([0.0]))
    restored.read(f"{bucket}/ckpt-7").assert_consumed()
    assert restored.weights.numpy().tolist() == [4.0]


def test_tensors_on_another_host_are_not_written_through_this_hosts_disk(monkeypatch):
    """Their save runs where they are (another worker, a TPU node's host), whose local disk
    is not this one's: written to gs:// directly, as TensorFlow does."""
    _, copy = host_copy_of([1.0])
    assert checkpoint_upload.upload_via_local_disk(copy, "ram://not-gs/ckpt-1") is False
    remote = "/job:worker/replica:0/task:1/device:CPU:0"
    monkeypatch.setattr(tf_internals, "host_copy_devices", lambda copy: {remote})
    assert checkpoint_upload.upload_via_local_disk(copy, "gs://b/ckpt-1") is False
