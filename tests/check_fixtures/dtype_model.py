"""Breaks `dtype`: numpy's default float64 features and int64 labels go to the TPU."""

import numpy as np
from fixture_base import ROWS, TinyModel

from tpurun.model import register


@register("check_dtype")
class Dtype(TinyModel):
    def data(self, mode):
        rng = np.random.default_rng(0)
        return rng.normal(size=(ROWS, 4)), rng.integers(0, 3, size=ROWS)  # float64, int64
