"""The command-line flags, as typed handles (`_BATCH_SIZE.value`), and which command takes which.

Defined on absl's global FLAGS when this module is imported. Flags that mirror a
config key default to None, meaning "keep the config's value"; see
`run_config.FLAG_TO_CONFIG_KEY`.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

# The argv config_flags reads the `--config.<key>` overrides from. Without it,
# config_flags reads sys.argv itself: at import time (so a missing --flagfile
# crashed with a traceback before main() could catch it), and at parse time
# (so `--config.x=v --config=iris` was an ordering error, and main(argv) ignored
# its argv). cli.parse fills it with the argv it parses.
CONFIG_ARGV: list[str] = []
CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "A registered config name (see `tpurun list`, e.g. iris) or a path to a config .py "
    "file with get_config(); `name:arg` passes arg to get_config. Override any key with "
    "--config.<key>=<value>, e.g. --config.optimizer.learning_rate=0.05. Default: iris.",
    lock_config=True,
    sys_argv=CONFIG_ARGV,
)
MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    None,
    "Where checkpoints, summaries, eval results and exports go (local path or gs://). "
    "Default: ./<config name>.",
)

# Where to run: the Cloud TPU cluster, or local devices.
TPU = flags.DEFINE_string(
    "tpu",
    None,
    "The Cloud TPU to use: its name (with --tpu_zone and --gcp_project), a grpc://host:port "
    "address, or 'local' on a TPU VM. Default: the TPU_NAME environment variable.",
)
TPU_ZONE = flags.DEFINE_string("tpu_zone", None, "GCE zone of the Cloud TPU, e.g. us-central1-b.")
GCP_PROJECT = flags.DEFINE_string("gcp_project", None, "GCP project that owns the Cloud TPU.")
USE_TPU = flags.DEFINE_bool(
    "use_tpu",
    None,
    "true: run on the TPU (fail if none is reachable); false: run on local CPU/GPUs; "
    "unset: use a TPU if one is configured or detected, else run locally.",
)
TPU_INIT_TIMEOUT = flags.DEFINE_float(
    "tpu_init_timeout",
    300,
    "Seconds to wait for the Cloud TPU (looking it up, connecting, initialising), or with "
    "a multi-worker TF_CONFIG for every worker to join, before failing; TensorFlow "
    "alone would wait forever.",
)
NUM_SHARDS = flags.DEFINE_integer(
    "num_shards",
    None,
    "Number of replicas. Locally: that many GPUs, or that many logical CPU devices "
    "(--num_shards=8 on a laptop behaves like the 8 cores of a v3-8). Default: all devices.",
)

# TPUEstimator-era shortcuts for config keys.
ITERATIONS = flags.DEFINE_integer(
    "iterations",
    None,
    "Training steps per host loop, run in-graph by one tf.function call "
    "(TPUEstimator's iterations_per_loop). Config key train.iterations.",
)
BATCH_SIZE = flags.DEFINE_integer(
    "batch_size",
    None,
    "Global training batch size, split evenly across replicas. Config key train.batch_size.",
)
EVAL_BATCH_SIZE = flags.DEFINE_integer(
    "eval_batch_size", None, "Global eval batch size. Config key eval.batch_size."
)
PREDICT_BATCH_SIZE = flags.DEFINE_integer(
    "predict_batch_size", None, "Global predict batch size. Config key predict.batch_size."
)
TRAIN_STEPS = flags.DEFINE_integer(
    "train_steps",
    None,
    "Total training steps (max_steps: a resumed run continues up to it). Config key train.steps.",
)
TRAIN_EPOCHS = flags.DEFINE_float(
    "train_epochs",
    None,
    "How long to train in epochs instead of --train_steps (one of them): the steps are "
    "ceil(epochs x training examples / (batch size x accumulate_steps)), counted from "
    "the model's train_arrays or config.data.train_examples. Config key train.epochs.",
)
EVAL_STEPS = flags.DEFINE_integer(
    "eval_steps",
    None,
    "Eval batches to run; 0 (the default) is one exact pass over the eval data. "
    "Config key eval.steps.",
)
SEED = flags.DEFINE_integer("seed", None, "Random seed (weights, shuffling). Config key seed.")
PRECISION = flags.DEFINE_enum(
    "precision",
    None,
    ["float32", "mixed_bfloat16", "mixed_float16"],
    "Keras precision policy: float32, mixed_bfloat16 (TPU native; 16-bit compute, float32 "
    "variables) or mixed_float16 (GPUs, with dynamic loss scaling). Config key precision.",
)

# train: checkpoints, resume, guard rails, visibility
SAVE_CHECKPOINTS_STEPS = flags.DEFINE_integer(
    "save_checkpoints_steps",
    None,
    "Save a checkpoint every this many steps (rounded up to a multiple of --iterations; "
    "0 = by time only). Config key train.save_checkpoints_steps.",
)
SAVE_CHECKPOINTS_SECS = flags.DEFINE_integer(
    "save_checkpoints_secs",
    None,
    "Save a checkpoint when this many seconds passed since the last one, checked after "
    "every host loop; with --save_checkpoints_steps, whichever comes first (0 = by steps "
    "only). Config key train.save_checkpoints_secs.",
)
KEEP_CHECKPOINT_MAX = flags.DEFINE_integer(
    "keep_checkpoint_max",
    None,
    "Keep this many most recent checkpoints (the best one is kept apart, see "
    "--eval_every). Config key train.keep_checkpoint_max.",
)
WARM_START_FROM = flags.DEFINE_string(
    "warm_start_from",
    None,
    "Initialise the model from another run's checkpoint (a ckpt-N path or a model_dir), "
    "then train from step 0; only variables matching config.train.warm_start_vars (a "
    "regex, default all) are taken. Config key train.warm_start_from.",
)
FORCE_RESUME = flags.DEFINE_bool(
    "force_resume",
    False,
    "Resume from model_dir's checkpoint even though this config changes the model or "
    "the batch size (tpurun refuses and lists the differences otherwise).",
)
FORCE_TAKEOVER = flags.DEFINE_bool(
    "force_takeover",
    False,
    "Take model_dir's trainer lease even though another tpurun train holds it: only for a "
    "trainer known to be gone on another machine before its lease went stale.",
)
HANG_TIMEOUT = flags.DEFINE_float(
    "hang_timeout",
    3600,
    "Exit with an error when a host loop (or a save) makes no progress for this many "
    "seconds (a stuck infeed or TPU) instead of hanging forever; 0 = never.",
)
PROFILE_STEPS = flags.DEFINE_string(
    "profile_steps",
    None,
    "START,END: capture a TensorFlow profiler trace of these steps (whole host loops) "
    "into model_dir/plugins/profile, for TensorBoard's profile tab.",
)
EVAL_EVERY = flags.DEFINE_string(
    "eval_every",
    None,
    "Evaluate (one exact pass) every this many steps and at the end, in the training "
    "process (rounded up to a multiple of --iterations; 0 = never), or 'epoch': at the "
    "end of every epoch (host loops end there). Config key train.eval_every.",
)

# eval
CONTINUOUS = flags.DEFINE_bool(
    "continuous",
    False,
    "eval: watch model_dir and evaluate every new checkpoint once (a sidecar evaluator); "
    "stop after the final step (--train_steps) or after --eval_timeout without a new one.",
)
EVAL_TIMEOUT = flags.DEFINE_float(
    "eval_timeout",
    3600,
    "eval --continuous: stop after this many seconds without a new checkpoint.",
)
SPLIT = flags.DEFINE_string(
    "split",
    None,
    "eval: the split to evaluate, one of the model's eval_splits (e.g. val, test); results "
    "go to eval/<split>/. Only config.eval.best_split updates best/. Default: "
    "config.eval.split, else the best_split. Config key eval.split.",
)

# predict
INPUT = flags.DEFINE_string(
    "input",
    None,
    "predict: a file of rows to predict (for iris: a CSV with the four feature columns). "
    "Default: the model's own examples. Config key predict.input.",
)
OUTPUT = flags.DEFINE_string(
    "output",
    None,
    "predict: write the predictions here instead of printing: one JSON line per input row, "
    "or by the extension .npz (an array per prediction) or .png (a grid of the predicted "
    "images, e.g. a generator's samples). Config key predict.output.",
)
PROMPT = flags.DEFINE_string(
    "prompt",
    None,
    "predict: the text a generative model continues (shakespeare). "
    "Config key predict.prompt, for configs that have it.",
)
# Model data (configs with a data.data_dir key, e.g. mnist).
DATA_DIR = flags.DEFINE_string(
    "data_dir",
    None,
    "Directory of the model's data files (local or gs://), e.g. the train-*.tfrecord and "
    "test-*.tfrecord files of mnist. Config key data.data_dir, for configs that have it.",
)
# export
EXPORT_DIR = flags.DEFINE_string(
    "export_dir",
    None,
    "export: directory for the SavedModel. Default: <model_dir>/export/<timestamp>.",
)
# eval, predict, export: which checkpoint
BEST = flags.DEFINE_bool(
    "best",
    False,
    "eval/predict/export: the best checkpoint by config.eval.best_metric on "
    "config.eval.best_split (kept in model_dir/best by evaluations) instead of the latest; "
    "eval --best records its results in best/results-<split>.json.",
)
CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    None,
    "eval/predict/export: the checkpoint ckpt-N of model_dir (--checkpoint=ckpt-N or "
    "--checkpoint=N) instead of the latest.",
)

# check
TARGET = flags.DEFINE_string(
    "target",
    None,
    "check: a Cloud TPU accelerator type (v2-8, v3-8, v4-8, v5litepod-8 or v5e-8, v5p-8, "
    "v6e-8, or a larger slice): also size each step's memory per replica on it, compiled "
    "by the TPU's own compiler (pip install 'tpurun[tpu-compile]'; else XLA's CPU "
    "estimate), fail if one does not fit, and bound each step's time and the run's price.",
)
REPORT = flags.DEFINE_string(
    "report",
    None,
    "check --target: also write each step's memory and bounds as JSON to this file (local "
    "or gs://).",
)
PRICE_PER_CHIP_HOUR = flags.DEFINE_float(
    "price_per_chip_hour",
    None,
    "check --target: the $ per chip-hour the run's cost bound uses, instead of the "
    "generation's on-demand list price (e.g. your region's, or a committed-use price).",
)
INPUT_CHECK = flags.DEFINE_bool(
    "input_check",
    True,
    "check --target: also run the model's training input here for a few seconds and say "
    "whether the target's hosts would keep its chips fed (false: skip it).",
)

MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts",
    0,
    "train: run the trainer in a child process and resume it in a fresh one, up to this "
    "many times, when it dies without finishing (killed by a signal tpurun did not get, a "
    "lost TPU worker or unreachable storage (exit 69), its hang watchdog (exit 3), a "
    "preemption (exit 75) tpurun did not ask for). 0: train in this process.",
)
JSON = flags.DEFINE_bool(
    "json", False, "report: print the report as one JSON object instead of a table."
)

COMMON_FLAGS = (
    "config",
    "model_dir",
    "tpu",
    "tpu_zone",
    "gcp_project",
    "use_tpu",
    "tpu_init_timeout",
    "num_shards",
    "iterations",
    "batch_size",
    "eval_batch_size",
    "predict_batch_size",
    "train_steps",
    "train_epochs",
    "eval_steps",
    "seed",
    "precision",
    "data_dir",
)
# Flags that only make sense for one command: given to another, they are an error.
COMMAND_FLAGS = {
    "train": (
        *COMMON_FLAGS,
        "save_checkpoints_steps",
        "save_checkpoints_secs",
        "keep_checkpoint_max",
        "warm_start_from",
        "force_resume",
        "force_takeover",
        "hang_timeout",
        "profile_steps",
        "eval_every",
        "max_restarts",
    ),
    "eval": (*COMMON_FLAGS, "split", "continuous", "eval_timeout", "best", "checkpoint"),
    "predict": (*COMMON_FLAGS, "input", "output", "prompt", "best", "checkpoint"),
    "export": (*COMMON_FLAGS, "export_dir", "best", "checkpoint"),
    # --num_shards sets the replicas to check for (default 8, a v3-8; --target sets
    # them too); --model_dir, --tpu and --use_tpu are accepted but unused: check
    # always traces on the CPU.
    "check": (*COMMON_FLAGS, "target", "report", "price_per_chip_hour", "input_check"),
    "list": (),
    "report": ("model_dir", "json"),
}
# Always accepted: absl's own (logging, flagfile, help).
ABSL_FLAGS = ("flagfile", "verbosity", "v", "logtostderr", "alsologtostderr", "log_dir")
