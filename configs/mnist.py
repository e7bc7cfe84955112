r"""MNIST digits: the CNN of "Using the Estimator API with TPUs" on TFRecords (image_raw, label).

Make the data once (from the official IDX files or keras' mnist.npz; no download):
  python scripts/convert_mnist.py --source=/path/to/mnist_dir_or_mnist.npz \
      --output_dir=/tmp/mnist/data

Run (laptop CPU, 8 replicas like a v3-8):
  tpurun train   --config=mnist --data_dir=/tmp/mnist/data --use_tpu=false --num_shards=8
  tpurun eval    --config=mnist --data_dir=/tmp/mnist/data
  tpurun predict --config=mnist --data_dir=/tmp/mnist/data --input='/tmp/my-*.tfrecord'
  tpurun export  --config=mnist --data_dir=/tmp/mnist/data

A whole large-batch recipe, `--config=mnist:recipe` (tpurun's config of every
recipe key; see docs/recipes.md): SGD with Nesterov momentum 0.9,
the learning rate 0.1 per 256 examples scaled to the global batch, 100 warmup
steps, cosine decay to zero, decoupled weight decay 5e-4 (not on biases), gradient
clipping at global norm 1.0, an EMA of the weights (0.999) that eval, predict and
export use, and mixed bfloat16:
  tpurun train --config=mnist:recipe --data_dir=/tmp/mnist/data --use_tpu=false

From TensorFlow Datasets instead, `--config=mnist:tfds` (docs/datasets.md): MNIST
as `tfds build mnist` prepares it, read by name from its data_dir (nothing is
downloaded at run time; prepare it once where the internet is):
  tfds build mnist --data_dir=gs://my-bucket/tensorflow_datasets
  tpurun train --config=mnist:tfds --use_tpu=false --model_dir=/tmp/mnist-tfds \
      --config.data.tfds_data_dir=gs://my-bucket/tensorflow_datasets

(predict and export read --data_dir too: predict's default input is the test
files, and export takes the feature spec from predict's input. The exported
signature takes serialized tf.Example strings of the TFRecord schema, `examples`;
--config.serving_input=image makes it take float32 `image` [batch, 784] instead.)

Cost: 1000 steps of global batch 1024 are ~68 TFLOP: measured 3.8 steps/s on a
2-core x86 CPU with AVX-512 (1 replica), so ~5 minutes (slower CPUs proportionally
longer); TPU v3-8: about a minute, mostly start-up. The recipe trains in bfloat16,
about 1.8x faster on a CPU with AVX512_BF16 (`make bench`), and natively on a TPU. The doc reports ~0.99 test
accuracy with these settings (not re-measured here: the tests use synthetic digits).
"""

import ml_collections

from tpurun import config_defaults


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="mnist")
    config.data = config_defaults.image_records_data()
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
    if variant == "recipe":
        _recipe(config)
    elif variant == "tfds":
        # TFDS's mnist (image uint8 [28, 28, 1], label), its train and test splits.
        config.data = config_defaults.tfds_data("mnist", {"train": "train", "test": "test"})
        config.data.shuffle_buffer = 10_000
    elif variant:
        raise ValueError(
            f"unknown variant {variant!r} of the mnist config; use mnist:recipe or mnist:tfds"
        )
    return config


def _recipe(config: ml_collections.ConfigDict) -> None:
    """Every recipe key at once: what a large-batch TPU run of this model would use."""
    config.precision = "mixed_bfloat16"
    config.optimizer.name = "sgd"
    config.optimizer.momentum = 0.9
    config.optimizer.nesterov = True
    config.optimizer.learning_rate = 0.1  # per base_batch_size examples...
    config.optimizer.base_batch_size = 256  # ...scaled to the global batch when built
    config.optimizer.warmup_steps = 100
    config.optimizer.schedule = "cosine"  # to zero at train.steps
    config.optimizer.weight_decay = 5e-4  # decoupled; biases excluded by default
    config.optimizer.clip_norm = 1.0
    config.train.ema_decay = 0.999
