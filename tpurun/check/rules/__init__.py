"""The TPU rules on a traced step: would a TPU compile it?

* `step_builds`: `StepBuilder`, each step (train, eval, predict) built as the runners
  build it, on the traced replicas or one device: what the rules check, and what
  `sizing` and `bounds` size and count.
* `steps`: `StepChecker`, each step built and checked: its input, its graph, its XLA
  compile.
* `input_rules`: what each replica receives per step (batch-split, batch-padding,
  static-batch, dtype).
* `graph_walk`: the traced graph walked op by op, nested functions included; `fixes`: what
  each of its findings means and how to fix it; `origin`: the user's line that made an op.
* `xla`: the step compiled by XLA for the CPU, as a TPU would compile it.
* `replica_rules`: what changes with the replica count (batch-norm).
* `findings`: `Problem` and `Finding`, what every rule reports, and how they are printed.
* `introspection`: every private Keras and TensorFlow detail the rules read, fenced.
"""
