"""tpurun: train, evaluate, predict with and export TensorFlow models on Cloud TPUs.

Importing this package is cheap on purpose: TensorFlow is imported only by the
modules that run a job (`tpurun.cluster`, `tpurun.train`, ...), so `tpurun --help`
and `tpurun list` answer in well under a second.

Model authors need `tpurun.model`: the `Model` base class, `Mode`, `InputParams`
and the `register` decorator.
"""

import sys

__version__ = "0.2.0"

# jax stays out of TensorFlow's process. TensorFlow imports it when it is installed
# (tf.lite's `from jax import jit`, for a converter tpurun never uses), and the
# `tpu-compile` extra installs it for the TPU compiler, which runs in a process of its
# own (tpurun.check.tpu_compiler): imported here, jaxlib's XLA would load beside
# TensorFlow's and add seconds to every start. None in sys.modules makes TensorFlow's
# guarded import fail as if jax were absent.
if "tensorflow" not in sys.modules:
    sys.modules.setdefault("jax", None)  # type: ignore[arg-type]

__all__ = ["__version__"]
