r"""Fashion-MNIST: the Keras CNN (BatchNorm, 3 conv blocks, dropout) of the Fashion-MNIST TPU example.

Make the data once from Fashion-MNIST's files (same names and npz keys as MNIST;
no download here):
  python scripts/convert_mnist.py --source=/path/to/fashion_dir_or_npz \
      --output_dir=/tmp/fashion/data

Run (laptop CPU, 8 replicas like a v3-8):
  tpurun train   --config=fashion_mnist --data_dir=/tmp/fashion/data --use_tpu=false \
      --num_shards=8
  tpurun eval    --config=fashion_mnist --data_dir=/tmp/fashion/data
  tpurun predict --config=fashion_mnist --data_dir=/tmp/fashion/data
  tpurun export  --config=fashion_mnist --data_dir=/tmp/fashion/data

Cost: ~0.5 GFLOP per training example (the 5x5 convs with 128 and 256 filters
dominate), so the 600 steps of global batch 1024 (~10 epochs, as in the example)
are ~300 TFLOP: measured 3.4 s per step on a 2-core x86 CPU, i.e. ~35 minutes
(shrink it with --config.conv_filters='(32, 64, 128)' or fewer steps); a few
minutes on a TPU v3-8. The example reports ~0.91 test accuracy after 10 epochs.
"""

import ml_collections

from tpurun import config_defaults


def get_config() -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="fashion_mnist")
    config.data = config_defaults.image_records_data()
    # The exported signature's input: "tf_example" = serialized tf.Example strings of
    # the TFRecord schema (`examples`, parsed inside the SavedModel, as TensorFlow
    # Serving's classify API sends them), or "image" = float32 [batch, 784] pixels
    # in [-0.5, 0.5] (`image`).
    config.serving_input = "tf_example"

    config.conv_filters = (64, 128, 256)
    # Keras' default; short runs (a few hundred steps) evaluate better with 0.9, as
    # the moving statistics eval uses then catch up with the data.
    config.bn_momentum = 0.99
    config.kernel_size = 5
    config.conv_dropout = 0.25
    config.hidden_units = 256
    config.dropout = 0.5

    # The example: Adam at 1e-3, batch 128 per core on 8 cores, 10 epochs of 60000.
    config.optimizer.name = "adam"
    config.optimizer.learning_rate = 0.001
    config.train.batch_size = 1024
    config.train.steps = 600
    config.train.iterations = 100
    config.eval.batch_size = 1024
    config.predict.batch_size = 256
    return config
