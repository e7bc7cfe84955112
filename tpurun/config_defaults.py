"""The config sections every tpurun config has, with their defaults.

A config file starts from `base_config(model=...)` and sets what its model
needs. The TPUEstimator-style flags (`--batch_size`, `--train_steps`,
`--iterations`, ...) are shortcuts for the keys below; `--config.train.batch_size`
works too. Only ml_collections and the standard library are imported here, so
loading a config never imports TensorFlow.
"""

from __future__ import annotations

import ml_collections


def base_config(model: str) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The registered model name; `model_module` names a module to import first
    # when the model is not one of tpurun's own (e.g. "my_project.my_model").
    config.model = model
    config.model_module = ""
    config.seed = 0
    # The Keras precision policy (--precision): float32, mixed_bfloat16 (a TPU's native
    # matmul type) or mixed_float16 (GPUs; dynamic loss scaling). Variables, and so
    # checkpoints, stay float32 under every one; loss, metrics and predictions are
    # computed in float32.
    config.precision = "float32"
    # How the model's variables were named in checkpoints tpurun did not write (TF1
    # name-based ones, TPUEstimator model_dirs, Estimator SavedModels), read by
    # --warm_start_from and --checkpoint=PATH: rules "SOURCE_REGEX -> model/variable/path"
    # ("SOURCE -> -" leaves SOURCE out), first match wins. The format:
    # tpurun/foreign/name_map.py; docs/checkpoints.md, "From a TPUEstimator model_dir".
    config.name_map = ()
    # The model's data: the keys its input_fn reads (a config adds its own), and where its
    # training input is made (`data_service`: here, or by a tf.data service).
    config.data = data_service()

    # The training recipe, built into a Keras optimizer by tpurun/optimization/building.py and
    # checked by tpurun/run_config/keys/recipe_keys.py (`optimizer_recipe` has its keys).
    config.optimizer = optimizer_recipe()
    # Named optimizers, for a model whose own train_step updates several parts with
    # optimizers of their own (a GAN's generator and critic): each a whole recipe,
    # `config.optimizers.critic = optimizer_recipe(learning_rate=2e-4, beta_1=0.5)`,
    # over the variables the model gives it (by default, those of its model of the
    # same name). With any, config.optimizer stays at its defaults.
    config.optimizers = ml_collections.ConfigDict()
    config.train = _train_section()
    config.eval = _eval_section()
    config.predict = _predict_section()
    return config


def _train_section() -> ml_collections.ConfigDict:
    """`config.train`: how long, how often to save and evaluate, and how the loop runs."""
    train = ml_collections.ConfigDict()
    train.batch_size = 128  # global: split evenly across replicas
    train.steps = 1000  # total (max_steps): a resumed run continues to it
    # Or how long in epochs (--train_epochs), 0 = off: train.steps is then derived when
    # the run starts, ceil(epochs x training examples / examples per step), where a step
    # takes batch_size x accumulate_steps examples and the training examples are the
    # model's train_arrays, a TFDS dataset's record or its TFRecord files counted, else
    # config.data.train_examples (a key a config with a tf.data input adds). Exclusive
    # with train.steps on the command line.
    train.epochs = 0.0
    train.iterations = 100  # steps per host loop (iterations_per_loop)
    # A checkpoint every N steps (rounded up to a multiple of iterations) or every
    # N seconds, whichever comes first; 0 turns one off. Always one at the end.
    train.save_checkpoints_steps = 0
    train.save_checkpoints_secs = 600  # TPUEstimator's default
    train.keep_checkpoint_max = 5
    # A save copies the state at its step to host memory (all the loop waits for) and
    # writes it in the background while training goes on; at most one is in flight.
    # The last save, one before a stop and one --eval_every evaluates are waited for.
    # false: the loop waits for every whole save (docs/checkpoints.md).
    train.async_checkpoint = True
    # On gs://, TensorBoard events are written in memory and uploaded in the background
    # every this many seconds and at the end (TensorBoard shows them that late at most);
    # on a local disk they are written there directly.
    train.summary_upload_secs = 30.0
    # Steps between evals in the training process, 0 = never; or "epoch": at the end of
    # every epoch. Of type object, so that --train.eval_every takes both.
    train.eval_every = ml_collections.FieldReference(0, field_type=object)
    # Initialise from another run's checkpoint (ckpt-N or a model_dir), then train
    # from step 0; only variables whose checkpoint key matches the regex are taken.
    train.warm_start_from = ""
    train.warm_start_vars = ".*"
    # An exponential moving average of the trainable weights, 0 = off: after each step
    # average = ema_decay x average + (1 - ema_decay) x weights (the first step copies
    # them). Kept by the optimizer beside the weights and saved in every checkpoint;
    # training itself always continues from the raw weights.
    train.ema_decay = 0.0
    # Gradient accumulation: one step sums the gradients of this many micro-batches of
    # train.batch_size each (in-graph), then applies them once, so the effective global
    # batch is accumulate_steps x train.batch_size. Steps, cadences and the step
    # counter count optimizer steps.
    train.accumulate_steps = 1
    # Device data: a model whose training examples are in-memory arrays (Model.train_arrays)
    # gets them placed once in every replica's memory, and each replica step gathers its
    # own batch, in the order tf.data would give (false: through tf.data). With one
    # replica the whole host loop is then compiled by XLA.
    train.device_data = True
    # The most memory per device (MB) the arrays may take, else they stay in tf.data;
    # 0 = automatic: 256 on CPU replicas, 2048 on a TPU core or GPU.
    train.device_data_mb = 0.0
    # With device data and one replica, compile the whole host loop with XLA: true, false
    # (a plain tf.function) or "auto": a run of at most 500 steps runs the plain one (XLA's
    # compile would cost more than it saves); a longer one times XLA's loop at the start
    # (and the plain one unless XLA's step is under 1 ms) and runs the plain one if 1.3x
    # faster or more; a resumed run keeps its first run's choice. "auto" never compiles on a CPU under
    # mixed_bfloat16, whose XLA backend has no fast bfloat16 matmuls (docs/device-data.md).
    # Of type object, so that --train.xla takes all three.
    train.xla = ml_collections.FieldReference("auto", field_type=object)
    # Deterministic kernels, so that a resumed run ends with the weights of an uninterrupted
    # one bit for bit (docs/checkpoints.md): true turns on TensorFlow's op determinism (tf.data
    # included) and turns off Grappler's arithmetic rewrites, which reorder sums differently
    # from one process to the next; false leaves TensorFlow's defaults. "auto": decided once
    # the platform is known (tpurun.run_config.keys.determinism.AUTO_CHOICE: on for a CPU, off
    # for a GPU and a TPU). Of type object, as train.xla.
    train.deterministic = ml_collections.FieldReference("auto", field_type=object)
    return train


def _eval_section() -> ml_collections.ConfigDict:
    """`config.eval`: the exact pass, and the split and metric that choose the best."""
    evaluation = ml_collections.ConfigDict()
    evaluation.batch_size = 128  # global
    evaluation.steps = 0  # 0 = one exact pass over the eval data
    # The checkpoint with the best value of this eval metric on best_split is kept in
    # model_dir/best (for `--best`); best_mode says whether "min" or "max" is best.
    evaluation.best_metric = "loss"
    evaluation.best_mode = "min"
    # The split (one of the model's eval_splits) that chooses the best checkpoint;
    # "" = "val" if the model has one, else its first split. No other touches best/.
    evaluation.best_split = ""
    # The split `tpurun eval` evaluates (--split); "" = best_split.
    evaluation.split = ""
    # More splits `train --eval_every` evaluates after best_split, comma-separated
    # (e.g. "test"): reported and recorded, never choosing the best.
    evaluation.also = ""
    return evaluation


def _predict_section() -> ml_collections.ConfigDict:
    """`config.predict`: what `tpurun predict` reads and where it writes."""
    predict = ml_collections.ConfigDict()
    predict.batch_size = 128  # global
    predict.input = ""  # a file of rows to predict; "" = the model's own examples
    # JSON lines, or by the extension .npz (arrays) or .png (a grid of images); "" = stdout
    predict.output = ""
    return predict


def data_service() -> ml_collections.ConfigDict:
    """The keys of `config.data` that send the training input through a tf.data service
    (docs/data-service.md); every `data` section starts from them (base_config,
    `image_records_data`, `tfds_data`): a config that sets its own `data` adds them with
    `config.data.update(config_defaults.data_service())`."""
    data = ml_collections.ConfigDict()
    # The dispatcher, grpc://HOST:PORT, of a service `tpurun data-service` runs; "" = off:
    # the input is made here and a resumed run continues it exactly. With it, the
    # service's workers run input_fn(TRAIN) and a resumed run restarts its input at the
    # start of the epoch it resumes in (not exact). Eval and predict always read here.
    data.service = ""
    # distributed_epoch: the workers share each epoch, every element once per epoch;
    # parallel_epochs: every worker makes the whole stream (input_fn seeded alike, so K
    # workers give each batch K times unless its randomness is its own).
    data.service_processing_mode = "distributed_epoch"
    # Seconds the dispatcher, or every worker, may stay silent (at start, or while
    # training) before the run ends at its last checkpoint with exit 69 (a restart resumes).
    data.service_timeout = 120.0
    return data


def image_records_data() -> ml_collections.ConfigDict:
    """`config.data` of a model reading the MNIST TFRecord schema (mnist, fashion_mnist,
    wgan_gp): where the records are and how they are read."""
    data = data_service()
    # A directory with train-*.tfrecord and test-*.tfrecord (what convert_mnist.py
    # writes); --data_dir sets it. The globs below win over it when set; several
    # globs are separated by commas. Local paths or gs://.
    data.data_dir = ""
    data.train_files = ""
    data.eval_files = ""
    data.shuffle_buffer = 10_000
    data.cycle_length = 4  # training files read in parallel
    # The training examples an epoch counts (--train_epochs, --eval_every=epoch): the
    # official training split of MNIST and Fashion-MNIST, which scripts/convert_mnist.py
    # writes. TFRecords do not say how many they hold; set it for other data.
    data.train_examples = 60_000
    return data


def tfds_data(name: str = "", splits: dict[str, str] | None = None) -> ml_collections.ConfigDict:
    """The keys of `config.data` that name a TensorFlow Datasets dataset (tpurun.datasets,
    docs/datasets.md); a config adds them to its `data` section with `data.update(...)`,
    or uses them as the whole section.

    `splits` maps tpurun's splits (train, and each of the model's eval_splits) to the
    dataset's own split names, e.g. {"train": "train", "val": "validation"}.
    """
    data = data_service()
    # The dataset's name as `tfds build` knows it, optionally with its config and
    # version: "imagenet2012", "mnist:3.0.1", "imagenet2012_subset/10pct:5.0.0". ""
    # = the model reads no TensorFlow Datasets dataset.
    data.tfds_name = name
    # Where `tfds build NAME --data_dir=DIR` prepared it (local or gs://); required
    # with tfds_name: tpurun never downloads a dataset, nor reads TFDS's default
    # ~/tensorflow_datasets behind a user's back.
    data.tfds_data_dir = ""
    # tpurun's split -> the dataset's split (any TFDS split spec: "train[:90%]" too).
    data.tfds_splits = ml_collections.ConfigDict(dict(splits or {"train": "train"}))
    return data


def optimizer_recipe(**keys: object) -> ml_collections.ConfigDict:
    """One optimizer's recipe, `config.optimizer` (or a `config.optimizers.<name>`): every key
    at its default (which leaves it off), then `keys`, e.g. beta_1=0.5 for adam."""
    recipe = ml_collections.ConfigDict()
    recipe.name = "adam"  # a keras.optimizers class: adam, adamw, sgd, rmsprop, ...
    recipe.learning_rate = 0.001
    # Linear scaling with the global batch, 0 = off: the rate is learning_rate x
    # train.batch_size / base_batch_size, computed when the optimizer is built, from
    # the final batch size, so --batch_size keeps it right.
    recipe.base_batch_size = 0
    # The rate over the steps, a function of the optimizer's step (so a resumed run
    # continues on the curve): constant | exponential | piecewise | cosine | linear.
    recipe.schedule = "constant"
    # Linear from 0 to the schedule's rate at step warmup_steps, then the schedule;
    # 0 = none. The decay keeps counting from step 0 (it is not shifted by the warmup).
    recipe.warmup_steps = 0
    # Where the warmup climbs to: "schedule" = the schedule's rate at warmup_steps (a
    # continuous curve); "peak" = learning_rate itself, the decay taking over at
    # warmup_steps (google-research/bert's optimization.py, Model Garden's WarmUp).
    recipe.warmup_target = "schedule"
    # Or the warmup in epochs (a float), 0 = none: made warmup_steps when the run starts,
    # ceil(epochs x training examples / examples per step), the examples counted as for
    # --train_epochs (config.data.train_examples, or the model's train_arrays).
    recipe.warmup_epochs = 0.0
    # exponential: rate x decay_rate^(step / decay_steps), as TF1's
    # tf.train.exponential_decay; staircase: the exponent in whole numbers.
    recipe.decay_steps = 0
    recipe.decay_rate = 0.0
    recipe.staircase = False
    # piecewise: rate x multipliers[i] while boundaries[i-1] < steps done <= boundaries[i],
    # as TF1's piecewise_constant; one more multiplier than boundaries. (Not `values`,
    # TF1's name: `config.optimizer.values` would be the ConfigDict.values method.)
    recipe.boundaries = ()
    recipe.multipliers = ()
    # piecewise, the boundaries in epochs instead (e.g. (30, 60, 80)): the rate becomes
    # multipliers[i + 1] at the first step by which boundary_epochs[i] epochs are done;
    # made `boundaries` in steps when the run starts, as warmup_epochs.
    recipe.boundary_epochs = ()
    recipe.alpha = 0.0  # cosine: to alpha x rate at train.steps (0 = to zero)
    recipe.end_learning_rate = 0.0  # linear: the rate (not a factor) at train.steps
    recipe.momentum = 0.0  # sgd and rmsprop only; 0 = none
    recipe.nesterov = False  # sgd only, with momentum > 0
    # Decoupled weight decay (Keras' weight_decay): every step each decayed variable is
    # multiplied by (1 - rate x weight_decay), apart from the gradient. 0 = none.
    recipe.weight_decay = 0.0
    # L2 regularization (TF1's `loss += l2_weight_decay x sum(tf.nn.l2_loss(w))`, as
    # tensorflow/tpu's resnet_main.py adds it): l2_weight_decay x w is added to each decayed
    # variable's gradient (summed over the replicas) before the optimizer's update, so it
    # goes through momentum, unlike weight_decay. The same exclusions. 0 = none.
    recipe.l2_weight_decay = 0.0
    # Variables NOT decayed: a regex searched in each Keras variable path
    # ("dense/bias", "batch_normalization/gamma"); default: biases and the scales and
    # offsets of normalization layers, matched as the last part of the path.
    recipe.weight_decay_exclude = r"(^|/)(bias|beta|gamma|scale|offset)(:0)?$"
    # Clip the gradients to this global norm, 0 = off. The norm is that of the gradients
    # summed over the replicas (the whole batch's), so 1 and 8 replicas clip alike.
    recipe.clip_norm = 0.0
    # Any other key added here is passed to the Keras optimizer (e.g. beta_1 for adam);
    # one its constructor does not take is an error.
    for key, value in keys.items():
        recipe[key] = value
    return recipe
