"""How fast a step can be, what it costs at least, and whether its input keeps up.

* `step_bounds`: a step's least time on the target, from its FLOPs and bytes against the
  chip's peaks, and the run's least time and price.
* `host_input`: the model's training input measured here, against what the target's
  train step takes per host.
* `step_flops`, `peaks`: MFU's numerator and denominator for `tpurun report`: the FLOPs of
  a run's train step as XLA compiles it, and its devices' peak FLOP/s.
"""
