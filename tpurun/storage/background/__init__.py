"""Storage off the training loop: one writer thread per run, and what goes through it.

* `writer.Writer`: the run's one background thread for storage. `submit(fn)`
  runs a function in order and hands back its Future (a checkpoint save waits on
  its own, and its failure is raised where the loop asks); `write(path, data)`
  writes a record or an events file, the newest data of a path winning, a failure
  only logged; `flush()` waits for everything handed over so far.
* `events.StagedEvents`: TensorBoard events of a gs:// model_dir written in memory
  and uploaded through the writer at a bounded cadence, in files rotated so that
  every byte is uploaded a bounded number of times.
* `checkpoint_upload.write`: a background save's files; for gs:// written on the
  local disk by TensorFlow and uploaded in place, the `.index` last (4 requests
  where TensorFlow's save on gs:// makes ~30).
"""

from __future__ import annotations

from tpurun.storage.background.writer import Writer

__all__ = ["Writer"]
