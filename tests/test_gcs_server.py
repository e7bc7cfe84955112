"""The GCS test server (tests/fake_gcs): TensorFlow's gs://, gcsfs and pandas reach it; faults and counts work.

TensorFlow and gcsfs run in this process, as they do when a test calls
`tpurun.cli.main`; the emulator and the proxy run in the session's server process.
"""

from __future__ import annotations

import gc
import http.client
import time

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from fake_gcs.server import GcsServer
from fake_gcs.traffic import classify

API, DOWNLOADS = "www.googleapis.com", "storage.googleapis.com"


def write(path: str, data: bytes | str) -> None:
    with tf.io.gfile.GFile(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def read(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def names(directory: str) -> set[str]:
    """Every file below `directory`, relative to it."""
    return {
        tf.io.gfile.join(root, name)[len(directory) + 1 :]
        for root, _, files in tf.io.gfile.walk(directory)
        for name in files
    }


# tf.io.gfile, through the proxy


def test_write_read_exists(bucket, gcs):
    data = bytes(range(256)) * 300  # 75 KiB of every byte value
    write(f"{bucket}/dir/blob.bin", data)
    assert read(f"{bucket}/dir/blob.bin") == data
    assert tf.io.gfile.exists(f"{bucket}/dir/blob.bin")
    assert tf.io.gfile.stat(f"{bucket}/dir/blob.bin").length == len(data)
    assert tf.io.gfile.isdir(f"{bucket}/dir")
    assert not tf.io.gfile.exists(f"{bucket}/dir/missing")
    hosts = {r.host for r in gcs.requests}
    assert hosts == {"www.googleapis.com", "storage.googleapis.com"}, hosts


def test_makedirs_listdir_glob(bucket):
    tf.io.gfile.makedirs(f"{bucket}/a/b/c")
    for name in ("a/x.txt", "a/y.txt", "a/b/z.txt"):
        write(f"{bucket}/{name}", name)
    assert tf.io.gfile.isdir(f"{bucket}/a/b/c")
    assert sorted(tf.io.gfile.listdir(f"{bucket}/a")) == ["b/", "x.txt", "y.txt"]
    assert sorted(tf.io.gfile.glob(f"{bucket}/a/*.txt")) == [
        f"{bucket}/a/x.txt",
        f"{bucket}/a/y.txt",
    ]
    assert tf.io.gfile.glob(f"{bucket}/a/*/z.*") == [f"{bucket}/a/b/z.txt"]


def test_rename_file(bucket, gcs):
    write(f"{bucket}/old.txt", "new")
    write(f"{bucket}/target.txt", "old")
    with pytest.raises(tf.errors.AlreadyExistsError):
        tf.io.gfile.rename(f"{bucket}/old.txt", f"{bucket}/target.txt")
    with gcs.counting() as log:
        tf.io.gfile.rename(f"{bucket}/old.txt", f"{bucket}/target.txt", overwrite=True)
    assert read(f"{bucket}/target.txt") == b"new"
    assert not tf.io.gfile.exists(f"{bucket}/old.txt")
    # GCS has no rename: a server-side copy, then a delete.
    assert log.objects("copy") == ["old.txt"]
    assert log.objects("delete") == ["old.txt"]


def test_rename_directory(bucket, gcs):
    tf.io.gfile.makedirs(f"{bucket}/src/sub")
    write(f"{bucket}/src/a.txt", "a")
    write(f"{bucket}/src/sub/b.txt", "b")
    with gcs.counting() as log:
        tf.io.gfile.rename(f"{bucket}/src", f"{bucket}/dst")
    assert names(f"{bucket}/dst") == {"a.txt", "sub/b.txt"}
    assert read(f"{bucket}/dst/sub/b.txt") == b"b"
    assert not tf.io.gfile.exists(f"{bucket}/src")
    # TensorFlow 2.21 asks whether the bucket has a hierarchical namespace (2.20 does not): the
    # proxy answers (the emulator cannot), no, so the directory is moved object by object.
    layouts = [r for r in log if r.path.endswith("/storageLayout")]
    if tuple(int(n) for n in tf.__version__.split(".")[:2]) >= (2, 21):
        [layout] = layouts
        assert (layout.kind, layout.status) == ("metadata", 200)
    else:
        assert layouts == []
    assert sorted(log.objects("copy")) == ["src/", "src/a.txt", "src/sub/", "src/sub/b.txt"]


def test_rmtree(bucket):
    tf.io.gfile.makedirs(f"{bucket}/tree/empty")
    write(f"{bucket}/tree/a.txt", "a")
    write(f"{bucket}/tree/deep/b.txt", "b")
    write(f"{bucket}/kept.txt", "k")
    tf.io.gfile.rmtree(f"{bucket}/tree")
    assert not tf.io.gfile.exists(f"{bucket}/tree")
    assert tf.io.gfile.listdir(bucket) == ["kept.txt"]


def test_checkpoint_save_and_restore(bucket):
    # Restoring reads with the GIL held (CheckpointReader): a proxy in this process would hang.
    weights = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4))
    step = tf.Variable(7, dtype=tf.int64)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=weights, step=step), f"{bucket}/model", max_to_keep=1
    )
    first = manager.save(checkpoint_number=7)
    weights.assign_add(tf.ones_like(weights))
    second = manager.save(checkpoint_number=8)
    assert tf.train.latest_checkpoint(f"{bucket}/model") == second == f"{bucket}/model/ckpt-8"
    assert not tf.io.gfile.glob(first + ".*"), "max_to_keep=1 deletes the older checkpoint"

    restored_weights, restored_step = tf.Variable(tf.zeros((3, 4))), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(weights=restored_weights, step=restored_step).restore(
        second
    ).assert_consumed()
    np.testing.assert_array_equal(restored_weights.numpy(), np.arange(12).reshape(3, 4) + 1)
    assert restored_step.numpy() == 7


def test_summary_event_file(bucket):
    logdir = f"{bucket}/logs/train"
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        for step in range(3):
            tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
    writer.close()
    [event_file] = tf.io.gfile.glob(f"{logdir}/events.out.tfevents.*")
    scalars = {}
    for record in tf.data.TFRecordDataset(event_file):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
            scalars[event.step] = float(tf.make_ndarray(value.tensor))
    assert scalars == pytest.approx({0: 1.0, 1: 0.5, 2: 1 / 3})


# gcsfs and pandas, through the proxy's plain address


def test_pandas_reads_what_tensorflow_wrote(bucket, gcs):
    write(f"{bucket}/data/iris.csv", "sepal,petal,label\n5.1,1.4,0\n6.3,6.0,2\n")
    with gcs.counting() as log:
        frame = pd.read_csv(f"{bucket}/data/iris.csv")
    assert frame.to_dict("list") == {"sepal": [5.1, 6.3], "petal": [1.4, 6.0], "label": [0, 2]}
    assert log.kinds()["download"] >= 1
    assert {r.host for r in log} == {gcs.env["STORAGE_EMULATOR_HOST"].removeprefix("http://")}


def test_tensorflow_reads_what_pandas_wrote(bucket):
    pd.DataFrame({"x": [1, 2, 3]}).to_csv(f"{bucket}/out/frame.csv", index=False)
    assert read(f"{bucket}/out/frame.csv").decode().split() == ["x", "1", "2", "3"]


# Counting


@pytest.mark.parametrize(
    ("method", "host", "target", "expected"),
    [
        ("GET", API, "/storage/v1/b/B/o/a%2Fb?fields=size", ("metadata", "B", "a/b")),
        ("GET", API, "/storage/v1/b/B", ("metadata", "B", "")),
        ("GET", API, "/storage/v1/b/B/storageLayout", ("metadata", "B", "")),
        ("GET", API, "/storage/v1/b/B/o?prefix=a%2F&delimiter=%2F", ("list", "B", "")),
        (
            "POST",
            API,
            "/upload/storage/v1/b/B/o?uploadType=resumable&name=a%2Fb",
            ("upload", "B", "a/b"),
        ),
        ("PUT", API, "/upload/storage/v1/b/B/o?name=a%2Fb&upload_id=7", ("upload", "B", "a/b")),
        ("GET", DOWNLOADS, "/B/a%2Fb", ("download", "B", "a/b")),
        (
            "GET",
            "127.0.0.1:9",
            "/download/storage/v1/b/B/o/a%2Fb?alt=media",
            ("download", "B", "a/b"),
        ),
        ("DELETE", API, "/storage/v1/b/B/o/a%2Fb", ("delete", "B", "a/b")),
        ("POST", API, "/storage/v1/b/B/o/a%2Fb/rewriteTo/b/B/o/c%2Fd", ("copy", "B", "a/b")),
        ("POST", "oauth2.googleapis.com", "/token", ("auth", "", "")),
        ("GET", API, "/discovery/v1/apis", ("other", "", "")),
    ],
)
def test_classify(method, host, target, expected):
    assert classify(method, host, target) == expected


def test_counting_counts_one_write_by_kind(bucket, gcs):
    with gcs.counting() as log:
        write(f"{bucket}/one.txt", "1")
    # A resumable upload: the POST that opens the session, the PUT with the bytes.
    assert [(r.method, r.kind, r.object) for r in log] == [
        ("POST", "upload", "one.txt"),
        ("PUT", "upload", "one.txt"),
    ]
    assert log.summary() == "2 requests: 2 upload"
    assert len(gcs.requests) == 2
    gcs.reset_requests()
    assert len(gcs.requests) == 0
    assert len(log) == 2, "a counting block keeps its requests"


# Faults

# How TensorFlow reports an HTTP status on a read. Retryable ones (5xx, 429) end as
# ABORTED "All 0 retry attempts failed": the tests run with GCS_RETRY_CONFIG_MAX_RETRIES=0.
READ_ERRORS = {
    401: tf.errors.PermissionDeniedError,
    403: tf.errors.PermissionDeniedError,
    404: tf.errors.NotFoundError,
    429: tf.errors.AbortedError,
    500: tf.errors.AbortedError,
    503: tf.errors.AbortedError,
}


@pytest.mark.parametrize("status", sorted(READ_ERRORS))
def test_failed_download_raises(bucket, gcs, status):
    write(f"{bucket}/file.txt", "contents")
    fault = gcs.fail(status, kind="download", path=r"file\.txt$")
    with pytest.raises(READ_ERRORS[status], match=str(status)):
        read(f"{bucket}/file.txt")
    assert fault.hits == 1
    assert [r.status for r in gcs.requests if r.kind == "download"] == [status]
    assert read(f"{bucket}/file.txt") == b"contents", "the fault acts once"


def test_fail_the_nth_upload(bucket, gcs):
    gcs.fail(503, kind="upload", method="PUT", nth=2)
    write(f"{bucket}/first.txt", "1")
    with pytest.raises(tf.errors.AbortedError, match="503"):
        write(f"{bucket}/second.txt", "2")
    # TensorFlow's writer, whose close() failed, uploads the file once more when it is
    # destroyed (its destructor closes it again): the error is raised, the file is there.
    # The raised error's traceback holds it in a cycle: collected now, not whenever.
    gc.collect()
    puts = [(r.object, r.status) for r in gcs.requests if r.method == "PUT"]
    assert puts == [("first.txt", 200), ("second.txt", 503), ("second.txt", 200)]
    assert read(f"{bucket}/second.txt") == b"2"


def test_unavailable_for_a_while(bucket, gcs):
    """Every request fails for `seconds` from the rule's making, by the server's clock: the
    machine's monotonic clock, as this process's, so what a request meets follows from
    when it was sent and answered, whatever the machine's speed."""
    write(f"{bucket}/file.txt", "x")
    seconds = 1.0
    asked = time.monotonic()
    fault = gcs.unavailable(seconds)
    made_by = time.monotonic()  # the server made the rule between `asked` and now
    try:
        read(f"{bucket}/file.txt")
        failure = None
    except tf.errors.AbortedError as e:
        failure = str(e)
    if time.monotonic() - asked < seconds:  # sent and answered within the window
        assert failure is not None and "503" in failure
    time.sleep(max(0.0, made_by + seconds - time.monotonic()))  # past the window
    assert read(f"{bucket}/file.txt") == b"x"
    assert fault.hits == (1 if failure else 0)


def test_connection_dropped_mid_upload(bucket, gcs):
    data = b"x" * 200_000
    # Every try is dropped: TensorFlow's writer tries again as it is destroyed (see above).
    fault = gcs.drop_connection(after_bytes=50_000, path="big.bin", times=None)
    # libcurl names the drop by where the upload was when it came: the reply awaited,
    # or (on a loaded machine) the body still being sent.
    dropped = "Empty reply from server|Failed sending data to the peer"
    with pytest.raises(tf.errors.AbortedError, match=dropped):
        write(f"{bucket}/big.bin", data)
    puts = [r for r in gcs.requests if r.method == "PUT"]
    assert puts and all(r.status is None and r.fault for r in puts), gcs.requests
    assert fault.hits == len(puts)
    assert not tf.io.gfile.exists(f"{bucket}/big.bin"), "a dropped upload leaves no object"
    gcs.clear_faults()
    write(f"{bucket}/big.bin", data)
    assert read(f"{bucket}/big.bin") == data


def test_slow_answers(bucket, gcs):
    write(f"{bucket}/file.txt", "x")
    gcs.slow(0.3, kind="list")
    start = time.monotonic()
    assert tf.io.gfile.listdir(bucket) == ["file.txt"]
    assert time.monotonic() - start >= 0.3
    # Logged before it was answered (tests/fake_gcs/proxy.py): there once the call returned.
    [listing] = [r for r in gcs.requests if r.kind == "list"]
    assert listing.seconds >= 0.3 and listing.status == 200


def test_proxy_refuses_other_hosts(gcs: GcsServer):
    proxy = gcs.env["https_proxy"].removeprefix("http://")
    tunnel = http.client.HTTPConnection(proxy, timeout=5)
    tunnel.set_tunnel("example.com", 443)
    with pytest.raises(OSError, match="403"):
        tunnel.connect()
    plain = http.client.HTTPConnection(proxy, timeout=5)
    plain.request("GET", "http://example.com/")
    assert plain.getresponse().status == 403
    refused = [(r.kind, r.host, r.status) for r in gcs.requests]
    assert refused == [
        ("refused", "example.com:443", 403),
        ("refused", "http://example.com/", 403),
    ]
