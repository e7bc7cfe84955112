"""Each step's memory per replica on a TPU target, before a TPU is rented.

* `preflight`: every step sized at the target's per-replica batch, against a replica's
  HBM, and searched for the largest batch that fits where it does not (`TargetMemory`).
* `tpu_compiler/`: the TPU's own compiler, in a process of its own (the `tpu-compile`
  extra): a step's memory and cost as it compiles it.
* `memory`: without it, the XLA:CPU estimate, in TPU tiles; `buffers`: XLA's buffer
  assignment read, each buffer filed as a weight, optimizer state, input or other.
* `batch_search`: the largest batch that fits, in a number of compiles stated in advance.
"""
