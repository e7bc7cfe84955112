r"""ResNet-50 on ImageNet: tensorflow/tpu's resnet_main.py recipe (batch 1024, 90 epochs, bfloat16).

Data, one of (docs/resnet50.md says how to make each):
  --data_dir=gs://BUCKET/imagenet       imagenet_to_gcs.py's train-*-of-01024 and
                                        validation-*-of-00128 TFRecords
  --config.data.tfds_name=imagenet2012 --config.data.tfds_data_dir=gs://BUCKET/tfds
                                        TFDS's imagenet2012, prepared once (`tfds build`)

Run (a TPU VM; check first: memory per replica, the time and price bound):
  tpurun check   --config=resnet50 --target=v5e-8 --data_dir=gs://BUCKET/imagenet
  tpurun train   --config=resnet50 --tpu=local --data_dir=gs://BUCKET/imagenet \
      --model_dir=gs://BUCKET/resnet50 --eval_every=epoch
  tpurun eval    --config=resnet50 --tpu=local --data_dir=gs://BUCKET/imagenet \
      --model_dir=gs://BUCKET/resnet50
  tpurun export  --config=resnet50 --data_dir=gs://BUCKET/imagenet \
      --model_dir=gs://BUCKET/resnet50
(--train_epochs=N for another length; the step decay stays at epochs 30, 60, 80.)

On a laptop CPU, `--config=resnet50:cpu`: 32x32 crops, width 8, one block per group,
10 classes, batch 32 (the tests' synthetic JPEGs; tests/synthetic_jpegs.py):
  tpurun train --config=resnet50:cpu --use_tpu=false --data_dir=/tmp/jpegs \
      --model_dir=/tmp/resnet50-cpu
`--config=resnet50:cosine` (or `resnet50:cpu,cosine`) decays by a cosine instead.

The recipe (resnet_main.py's, see docs/resnet50.md for each key): SGD with Nesterov
momentum 0.9; 0.1 per 256 examples scaled to the global batch (0.4 at 1024); linear
warmup over 5 epochs; x0.1 at epochs 30, 60 and 80; L2 weight decay 1e-4 on the
kernels (in the gradient, through the momentum, as resnet_main's L2 loss); no label
smoothing (resnet_main's default; --config.label_smoothing=0.1 is Model Garden's);
bfloat16 compute; exact eval over all 50,000 validation images.

Cost: 4.1 GFLOP per 224x224 image forward, ~12.3 GFLOP per training example, so
90 epochs are ~1.4 EFLOP. tensorflow/tpu's README: "above 76% accuracy in around 17
hours" at batch 1024 on one Cloud TPU of its day (a v2-8); `tpurun check --target`
prints the bound for any slice (docs/resnet50.md has v3-8, v4-8 and v5e-8). A CPU
cannot train it: 224x224 runs ~10 images/s here. The cpu variant trains 20 steps
in under a minute on a 2-core CPU.
"""

import ml_collections

from tpurun import config_defaults

IMAGENET_TRAIN_EXAMPLES = 1_281_167


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="resnet50")
    config.precision = "mixed_bfloat16"  # resnet_main.py's precision=bfloat16

    # A directory of imagenet_to_gcs.py's files (--data_dir sets it), or globs that win
    # over it (several separated by commas). Local paths or gs://.
    config.data.data_dir = ""
    config.data.train_files = ""
    config.data.eval_files = ""
    # Training records shuffled in a buffer of this many (resnet_main.py's 16 x 1024),
    # after the files' order is shuffled every epoch; and files read at once.
    config.data.shuffle_buffer = 16 * 1024
    config.data.cycle_length = 64
    # What an epoch counts (--train_epochs, the warmup and the decay epochs); with a
    # TFDS dataset, its train split's own count.
    config.data.train_examples = IMAGENET_TRAIN_EXAMPLES
    # Or TFDS's imagenet2012, prepared once (`tfds build`): --config.data.tfds_name=
    # imagenet2012 --config.data.tfds_data_dir=gs://... (then data_dir is not read).
    config.data.update(
        config_defaults.tfds_data("", {"train": "train", "validation": "validation"})
    )

    config.image_size = 224  # the crop's side, in training and eval
    config.width = 64  # the filters of the first group (x2 per group, x4 out)
    config.blocks = (3, 4, 6, 3)  # bottleneck blocks per group: ResNet-50
    config.num_classes = 1000
    config.label_smoothing = 0.0

    config.optimizer.name = "sgd"
    config.optimizer.momentum = 0.9
    config.optimizer.nesterov = True
    config.optimizer.learning_rate = 0.1  # per base_batch_size examples...
    config.optimizer.base_batch_size = 256  # ...scaled to the global batch
    config.optimizer.warmup_epochs = 5.0
    config.optimizer.schedule = "piecewise"
    config.optimizer.boundary_epochs = (30, 60, 80)
    config.optimizer.multipliers = (1.0, 0.1, 0.01, 0.001)
    config.optimizer.l2_weight_decay = 1e-4

    config.train.batch_size = 1024
    config.train.epochs = 90.0
    config.train.iterations = 1251  # resnet_main.py's iterations_per_loop: ~an epoch
    config.eval.batch_size = 1024
    config.eval.best_metric = "top_1_accuracy"
    config.eval.best_mode = "max"
    config.predict.batch_size = 1024

    variants = set(filter(None, variant.split(",")))
    unknown = variants - {"cpu", "cosine"}
    if unknown:
        raise ValueError(
            f"unknown variant {','.join(sorted(unknown))!r} of the resnet50 config; use "
            "resnet50:cpu, resnet50:cosine or resnet50:cpu,cosine"
        )
    if "cosine" in variants:
        config.optimizer.schedule = "cosine"  # to zero at the last step, after the warmup
        config.optimizer.boundary_epochs = ()
        config.optimizer.multipliers = ()
    if "cpu" in variants:
        _cpu(config)
    # Made for the final blocks (a variant's too); with --config.blocks=..., give the map
    # of that depth as well (docs/checkpoints.md says how).
    config.name_map = resnet_main_name_map(config.blocks)
    return config


def resnet_main_name_map(blocks: tuple[int, ...]) -> tuple[str, ...]:
    """config.name_map of tensorflow/tpu's resnet_main.py checkpoints (models/official/resnet).

    Its resnet_model.py made its layers with tf.layers, which names them by graph-wide
    counters in the order they are made: `conv2d`, `conv2d_1`, ... and
    `batch_normalization`, `batch_normalization_1`, ..., then `dense`. The order: the
    stem's convolution and batch norm; then in each block, the projection shortcut's
    (first blocks only) before the block's three; ResNet-50 has conv2d .. conv2d_52. The
    dense layer's 1000 classes are imagenet_input.py's labels minus one, as
    models/imagenet_records.py reads them. Its Momentum slots and global_step are left.
    """
    layers = [("stem_conv", "stem_bn")]
    for group, count in enumerate(blocks):
        for block in range(count):
            name = f"group{group + 1}_block{block + 1}"
            if not block:
                layers.append((f"{name}_project", f"{name}_project_bn"))
            layers += [(f"{name}_conv{i}", f"{name}_bn{i}") for i in (1, 2, 3)]
    rules = []
    for index, (conv, batch_norm) in enumerate(layers):
        suffix = f"_{index}" if index else ""
        rules.append(f"conv2d{suffix}/kernel -> {conv}/kernel")
        rules.append(
            rf"batch_normalization{suffix}/(gamma|beta|moving_mean|moving_variance) -> "
            rf"{batch_norm}/\1"
        )
    rules.append(r"dense/(kernel|bias) -> logits/\1")
    return tuple(rules)


def _cpu(config: ml_collections.ConfigDict) -> None:
    """The same code at a laptop's size: what the tests train in seconds."""
    config.image_size = 32
    config.width = 8
    config.blocks = (1, 1, 1, 1)
    config.num_classes = 10
    config.data.shuffle_buffer = 256
    config.data.cycle_length = 4
    config.data.train_examples = 320  # tests/synthetic_jpegs.py's training images
    config.optimizer.learning_rate = 0.8  # 0.1 at batch 32
    config.optimizer.warmup_epochs = 0.5
    config.train.batch_size = 32
    config.train.epochs = 0.0
    config.train.steps = 20
    config.train.iterations = 10
    config.eval.batch_size = 32
    config.predict.batch_size = 32
