"""Iris classifier of the TPUEstimator tutorial: 4 measurements -> DNN 10x10 -> 3 species.

Run (laptop CPU, 8 replicas like a v3-8):
  tpurun train   --config=iris --use_tpu=false --num_shards=8
  tpurun eval    --config=iris
  tpurun predict --config=iris
  tpurun export  --config=iris

Cost: laptop CPU, 1 replica: about 5 s for the 1000 steps (most of it TensorFlow
start-up); TPU v3-8: the same order, dominated by TPU initialisation. Reaches
~0.97 accuracy on the 30 test rows.
"""

import ml_collections

from tpurun import config_defaults


def get_config() -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="iris")
    # "" = the iris_training.csv / iris_test.csv shipped with tpurun; any path
    # pandas/gcsfs can read (local or gs://) works too.
    config.data.train_path = ""
    config.data.eval_path = ""

    config.hidden_units = (10, 10)
    config.n_classes = 3

    # As in the tutorial: Adagrad at 0.1, global batch 32 (TPUEstimator's flag
    # default was 128; 32 keeps enough updates on 120 rows).
    config.optimizer.name = "adagrad"
    config.optimizer.learning_rate = 0.1
    config.train.batch_size = 32
    config.train.steps = 1000
    config.train.iterations = 100
    config.train.save_checkpoints_steps = 500
    config.eval.batch_size = 32
    config.eval.best_metric = "accuracy"
    config.eval.best_mode = "max"
    config.predict.batch_size = 8
    return config
