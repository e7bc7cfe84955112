"""tpurun: train, evaluate, predict with and export TensorFlow models on Cloud TPUs.

Importing this package is cheap on purpose: TensorFlow is imported only by the
modules that run a job (`tpurun.cluster`, `tpurun.train`, ...), so `tpurun --help`
and `tpurun list` answer in well under a second.

Model authors need `tpurun.model`: the `Model` base class, `Mode`, `InputParams`
and the `register` decorator.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
