r"""FLOPS: a quick test, just to measure FLOPS - chained N x N matmuls on every replica.

Run (train a few loops, then measure; predict prints TFLOP/s per replica and in
total for float32 and bfloat16):
  tpurun train   --config=flops --use_tpu=false --model_dir=/tmp/flops
  tpurun predict --config=flops --use_tpu=false --model_dir=/tmp/flops

On a TPU, the Colab's size (N=4096, 100 products per replica):
  tpurun train   --config=flops --tpu=... --model_dir=gs://bucket/flops \
      --config.flops.n=4096 --batch_size=32768 --train_steps=20 --iterations=10
  tpurun predict --config=flops --tpu=... --model_dir=gs://bucket/flops \
      --config.flops.n=4096 --config.flops.loops=10 --config.flops.matmuls=10

Cost: the defaults (N=1024, 10 products per step, batch 1024, 10 steps) are 0.62
TFLOP of training ((6K - 2) * B * N^2 a step: models/flops.py) and 2 x 0.43 TFLOP of
measurement: 10-20 s on a laptop CPU (a
2-core x86 with AVX-512/AMX, shared, measured 0.13-0.31 TFLOP/s float32 and 0.8
bfloat16); on a TPU v3-8 start-up dominates.
The measured rate counts 2 * N^3 FLOP per product per replica, over the wall-clock
time of the timed loops only (a warm-up call compiles first).
"""

import ml_collections

from tpurun import config_defaults


def get_config() -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="flops")
    config.flops = ml_collections.ConfigDict()
    config.flops.n = 1024  # the matrices are N x N
    config.flops.matmuls = 10  # chained products per training step / per timed loop
    config.flops.loops = 20  # timed loops in `tpurun predict`
    config.flops.dtype = "both"  # what `predict` measures: float32, bfloat16 or both
    config.flops.eval_batches = 2

    config.optimizer.name = "sgd"
    config.optimizer.learning_rate = 0.01
    # Global batch: rows of x. With N rows per replica a product is 2 N^3 FLOP.
    config.train.batch_size = 1024
    config.train.steps = 10
    config.train.iterations = 5
    config.eval.batch_size = 1024
    config.predict.batch_size = 1024
    return config
