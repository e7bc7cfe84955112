"""Storage off the training loop: one writer thread per run, and what goes through it.

* `writer.Writer`: the run's one background thread for storage. `submit(fn)`
  runs a function in order and hands back its Future (a checkpoint save waits on
  its own, and its failure is raised where the loop asks); `write(path, data)`
  writes a record or an events file, the newest data of a path winning, a failure
  only logged; `flush()` waits for everything handed over so far."""

from __future__ import annotations

from tpurun.background.writer import Writer

__all__ = ["Writer"]
