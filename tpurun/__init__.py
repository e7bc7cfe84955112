"""tpurun: train, evaluate, predict with and export TensorFlow models on Cloud TPUs.

Importing this package is cheap on purpose: TensorFlow is imported only by the
modules that run a job (`tpurun.cluster`, `tpurun.runners.train`, ...), so `tpurun --help`
and `tpurun list` answer in well under a second.

Model authors need `tpurun.model`: the `Model` base class, `Mode`, `InputParams`
and the `register` decorator.
"""

import os
import sys

__version__ = "0.2.0"

# jax stays out of TensorFlow's process. TensorFlow imports it when it is installed
# (tf.lite's `from jax import jit`, for a converter tpurun never uses), and the
# `tpu-compile` extra installs it for the TPU compiler, which runs in a process of its
# own (tpurun.check.sizing.tpu_compiler): imported here, jaxlib's XLA would load beside
# TensorFlow's and add seconds to every start. None in sys.modules makes TensorFlow's
# guarded import fail as if jax were absent.
if "tensorflow" not in sys.modules:
    sys.modules.setdefault("jax", None)  # type: ignore[arg-type]

__all__ = ["__version__"]

# gs:// metadata read fresh. TensorFlow's GCS file system keeps what a stat, an
# exists or an isdir found for 5 seconds (GCS_STAT_CACHE_MAX_AGE, read once, when
# TensorFlow is imported), and it forgets an entry only on its own writes: a sidecar
# would take a rewritten `checkpoint` state file for the old one, a resume or an
# eval a removed file or directory for present, and GFile.read() reads a rewritten
# file to its old length. tpurun's processes read what other processes write, so
# none keeps such answers; set before anything imports TensorFlow, and a value the
# user set wins (docs/storage.md: what it costs).
os.environ.setdefault("GCS_STAT_CACHE_MAX_AGE", "0")
