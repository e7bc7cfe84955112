"""TensorBoard events for a model_dir not on this machine (gs://), uploaded off the loop:
`StagedEvents`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import tensorflow as tf

from tpurun import storage
from tpurun.layout import names
from tpurun.storage.background.writer import Writer

# An events file is uploaded whole at most this many times, then the next one is
# started: every byte of events goes up at most UPLOADS_PER_FILE times.
UPLOADS_PER_FILE = 10


class StagedEvents:
    """A TensorBoard summary writer for `logdir` whose writes never wait on storage.

    TensorFlow's own writer on gs:// uploads the whole events file again at every
    flush, inside the training loop: the bytes uploaded grow with the square of the
    run. Here the events are written to a file in memory (ram://) and, every
    `upload_secs` (`after_loop`) and at `close`, the file as it is so far is handed
    to the run's `Writer`, which uploads it under its name in `logdir`. After
    UPLOADS_PER_FILE uploads the file is finished and a new one started (named to
    sort after it, as TensorBoard expects), so the bytes uploaded grow linearly with
    the run, and one file is made per UPLOADS_PER_FILE x upload_secs at most.
    TensorBoard shows the scalars up to `upload_secs` late, and everything at the end.
    """

    def __init__(
        self,
        logdir: str,
        writer: Writer,
        upload_secs: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._logdir, self._writer, self._every, self._clock = logdir, writer, upload_secs, clock
        self._staging = f"ram://tpurun-events-{uuid.uuid4().hex}"
        self._start = time.time()  # names its files, sorting in the order they are made
        self._files = 0
        self._uploads = 0
        self._changed = False
        self._last_upload = clock()
        self.summary_writer = self._open()

    def _open(self) -> tf.summary.SummaryWriter:
        directory = f"{self._staging}/{self._files}"
        tf.io.gfile.makedirs(directory)
        return tf.summary.create_file_writer(directory)

    @property
    def _path(self) -> str:
        return storage.join(self._logdir, names.events_file(self._start, self._files))

    def wrote(self) -> None:
        """Events were written to `summary_writer`: they go with the next upload."""
        self._changed = True

    def after_loop(self) -> None:
        """Uploads the events file when `upload_secs` have passed since the last upload."""
        if self._changed and self._clock() - self._last_upload >= self._every:
            self.upload()

    def upload(self, finish: bool = False) -> None:
        """Hands the events file as it is to the writer; `finish`: start a new one after it."""
        self.summary_writer.flush()
        directory = f"{self._staging}/{self._files}"
        [name] = tf.io.gfile.listdir(directory)
        with tf.io.gfile.GFile(f"{directory}/{name}", "rb") as f:
            self._writer.write(self._path, f.read())
        self._uploads += 1
        self._changed = False
        self._last_upload = self._clock()
        if finish or self._uploads >= UPLOADS_PER_FILE:
            self.summary_writer.close()
            tf.io.gfile.rmtree(directory)
            self._files += 1
            self._uploads = 0
            self.summary_writer = self._open()

    def close(self) -> None:
        """Hands over what is not uploaded yet and frees the memory (the writer uploads it)."""
        if self._changed:
            self.upload()
        self.summary_writer.close()
        tf.io.gfile.rmtree(self._staging)
