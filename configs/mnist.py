r"""MNIST digits: the CNN of "Using the Estimator API with TPUs" on TFRecords (image_raw, label).

Make the data once (from the official IDX files or keras' mnist.npz; no download):
  python scripts/convert_mnist.py --source=/path/to/mnist_dir_or_mnist.npz \
      --output_dir=/tmp/mnist/data

Run (laptop CPU, 8 replicas like a v3-8):
  tpurun train   --config=mnist --data_dir=/tmp/mnist/data --use_tpu=false --num_shards=8
  tpurun eval    --config=mnist --data_dir=/tmp/mnist/data
  tpurun predict --config=mnist --data_dir=/tmp/mnist/data --input='/tmp/my-*.tfrecord'
  tpurun export  --config=mnist --data_dir=/tmp/mnist/data

(predict and export read --data_dir too: predict's default input is the test
files, and export takes the feature spec from predict's input. The exported
signature takes serialized tf.Example strings of the TFRecord schema, `examples`;
--config.serving_input=image makes it take float32 `image` [batch, 784] instead.)

Cost: 1000 steps of global batch 1024 are ~68 TFLOP: measured 3.8 steps/s on a
2-core x86 CPU with AVX-512 (1 replica), so ~5 minutes (slower CPUs proportionally
longer); TPU v3-8: about a minute, mostly start-up. The doc reports ~0.99 test
accuracy with these settings (not re-measured here: the tests use synthetic digits).
"""

import ml_collections

from tpurun import config_defaults


def get_config() -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="mnist")
    config.data = ml_collections.ConfigDict()
    # A directory with train-*.tfrecord and test-*.tfrecord (what convert_mnist.py
    # writes); --data_dir sets it. The globs below win over it when set; several
    # globs are separated by commas. Local paths or gs://.
    config.data.data_dir = ""
    config.data.train_files = ""
    config.data.eval_files = ""
    config.data.shuffle_buffer = 10_000
    config.data.cycle_length = 4  # training files read in parallel
    # The exported signature's input: "tf_example" = serialized tf.Example strings of
    # the TFRecord schema (`examples`, parsed inside the SavedModel, as TensorFlow
    # Serving's classify API sends them), or "image" = float32 [batch, 784] pixels
    # in [-0.5, 0.5] (`image`).
    config.serving_input = "tf_example"

    config.conv_filters = (32, 64)
    config.kernel_size = 5
    config.hidden_units = 128
    config.dropout = 0.4

    # mnist_tpu.py's flags: SGD at 0.05, global batch 1024, 1000 steps, 50 per loop.
    config.optimizer.name = "sgd"
    config.optimizer.learning_rate = 0.05
    config.train.batch_size = 1024
    config.train.steps = 1000
    config.train.iterations = 50
    config.eval.batch_size = 1024
    config.predict.batch_size = 256
    return config
