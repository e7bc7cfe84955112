"""What `tpurun check --target` says of each step's memory, and what it writes.

* `fit_report`: the memory table, and the `--report` JSON (with the bounds and the input).
* `fit_findings`: the `memory` finding of a step that does not fit, and its levers.
* `device_memory`: on the device, a TPU's out-of-memory error said in those words, and the
  memory a finished run records beside the devices' peak.
"""
