"""`tpurun train --max_restarts=N`: the trainer in a child process, resumed after a death.

This package imports no TensorFlow: the supervising process never loads it.

* `restarts`: `supervise` (the trainer started, its signals forwarded, restarted after a
  death that passes, with a backoff) and `wanted` (whether this train supervises);
* `exits`: how a trainer ended, and whether that is restartable;
* `protocol`: what trainer and supervisor tell each other (environment, progress pipe);
* `tpu_wait`: before a restart on a named Cloud TPU, its wait until the node is READY;
* `post_mortem`: the run record of a trainer that died before it wrote its own.
"""

from __future__ import annotations

from tpurun.supervisor.restarts import supervise, wanted

__all__ = ["supervise", "wanted"]
