"""Every flag of tpurun, once: its name, type, help, the commands that take it, the config key
it sets and the bound of its value; and the bounds of the config keys no flag sets.

From this table come the absl definitions (`tpurun.cli.handles`), each command's flags
(`COMMAND_FLAGS`: what `tpurun <command> --help` lists and what the command accepts),
the flag -> config-key map (`FLAG_TO_CONFIG_KEY`: `--batch_size` is a shortcut for
`--config.train.batch_size`) and the check of every value's bound (`check_config`,
`check_run`). Adding a flag is adding a row; nothing here imports absl or TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from tpurun.errors import UsageError
from tpurun.layout import names
from tpurun.run_config import command_table
from tpurun.run_config.bounds import (
    MAX_ACCUMULATE_STEPS,
    MAX_CHECKPOINTS_KEPT,
    MAX_DEVICE_DATA_MB,
    MAX_EPOCHS,
    MAX_ITERATIONS,
    MAX_PREDICT_BATCH,
    MAX_REPLICAS,
    MAX_RESTARTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    Batch,
    Boolean,
    BooleanOrWord,
    Bound,
    Integer,
    Number,
    StepsOrEpoch,
)

# The commands a flag row names, by the command table's names.
TRAIN, EVAL, PREDICT, EXPORT, CHECK, REPORT, SERVE = (
    (command.name,)
    for command in (
        command_table.TRAIN,
        command_table.EVAL,
        command_table.PREDICT,
        command_table.EXPORT,
        command_table.CHECK,
        command_table.REPORT,
        command_table.DATA_SERVICE,
    )
)
# The commands that run a config.
RUNS = tuple(c.name for c in command_table.COMMANDS if c.parses is command_table.Parses.CONFIG)
EPOCH = "epoch"  # --eval_every=epoch
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OFF = " (0 = off)"
MAX_PRICE = 10**6  # $ per chip-hour
MAX_PORT = 65535


def parse_checkpoint(text: str | None) -> int | str | None:
    """--checkpoint=ckpt-N or --checkpoint=N: the step N of model_dir's ckpt-N; any other text
    is the path of a checkpoint outside it (tpurun.foreign: a prefix, a model_dir or a
    SavedModel, local or gs://), made absolute when local. None: not given."""
    if text is None:
        return None
    step = names.step_argument(text)
    if step is not None:
        return step
    path = text.strip()
    if not path:
        raise UsageError(
            "--checkpoint= is empty; give ckpt-N or its step N (of model_dir), or the path of "
            "a checkpoint (e.g. --checkpoint=gs://bucket/run/model.ckpt-112590)"
        )
    return path if "://" in path else os.path.abspath(path)


def parse_step_range(text: str | None) -> tuple[int, int] | None:
    """--profile_steps=START,END as two ints (None: not given)."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", text)
    if not match:
        raise UsageError(
            f"--profile_steps={text} must be two step numbers START,END, e.g. --profile_steps=100,110"
        )
    return int(match.group(1)), int(match.group(2))


def parse_eval_every(text: str | int | None) -> int | str | None:
    """--eval_every: a number of steps or "epoch" (the flag is a string)."""
    if text is None or not isinstance(text, str):
        return text  # not given, or a number already (a caller's flag values): bounded later
    if text.strip().lower() == EPOCH:
        return EPOCH
    try:
        return int(text)
    except ValueError:
        raise UsageError(
            f"--eval_every={text} must be a number of steps (0 = never) or 'epoch' (at the "
            "end of every epoch)"
        ) from None


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag."""

    name: str
    kind: str  # absl's: "string", "integer", "float", "bool", "enum" (or "config": --config)
    commands: tuple[str, ...]  # the commands that take it; any other refuses it
    help: str
    # The config key it sets ("": none): given, it replaces the config's value; not
    # given (None), the config's value stays.
    key: str = ""
    default: Any = None
    choices: tuple[str, ...] = ()
    bound: Bound | None = None  # of the value: the config key's, or the flag's own
    # The key exists in some configs only (data.data_dir): given to another, an error.
    some_configs: bool = False
    field: bool = False  # it fills the RunConfig field of its name
    # Its text as the value it stands for (--checkpoint=ckpt-3 -> 3), or a UsageError.
    parse: Callable[[Any], Any] | None = None
    # Of a command whose line takes a word first (its row's `words`: data-service's role),
    # the words that take it; () = every one.
    words: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        """How a message names it: `--batch_size (config.train.batch_size)`."""
        return f"--{self.name} (config.{self.key})" if self.key else f"--{self.name}"

    def value_of(self, given: Any) -> Any:
        """The flag's value as its config key or RunConfig field takes it."""
        return self.parse(given) if self.parse is not None else given

    def check(self, value: Any) -> None:
        """Refuses a value out of the flag's bound (one UsageError line)."""
        if self.bound is not None:
            self.bound.check(self.shown, value)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    Flag("config", "config", RUNS,
         help="A registered config name (see `tpurun list`, e.g. iris) or a path to a config .py file"
              " with get_config(); `name:arg` passes arg to get_config. Override any key with "
              "--config.<key>=<value>, e.g. --config.optimizer.learning_rate=0.05. Default: iris."),
    Flag("model_dir", "string", RUNS + REPORT,
         help="Where checkpoints, summaries, eval results and exports go (local path or gs://). "
              "Default: ./<config name>."),
    Flag("tpu", "string", RUNS,
         help="The Cloud TPU to use: its name (with --tpu_zone and --gcp_project), a grpc://host:port"
              " address, or 'local' on a TPU VM. Default: the TPU_NAME environment variable."),
    Flag("tpu_zone", "string", RUNS, field=True,
         help="GCE zone of the Cloud TPU, e.g. us-central1-b."),
    Flag("gcp_project", "string", RUNS, field=True,
         help="GCP project that owns the Cloud TPU."),
    Flag("use_tpu", "bool", RUNS, field=True,
         help="true: run on the TPU (fail if none is reachable); false: run on local CPU/GPUs; unset:"
              " use a TPU if one is configured or detected, else run locally."),
    Flag("tpu_init_timeout", "float", RUNS, default=300, bound=Number(0, MAX_SECONDS, above=True), field=True,
         help="Seconds to wait for the Cloud TPU (looking it up, connecting, initialising), or with a"
              " multi-worker TF_CONFIG for every worker to join, before failing; TensorFlow alone "
              "would wait forever."),
    Flag("num_shards", "integer", RUNS, bound=Integer(1, MAX_REPLICAS), field=True,
         help="Number of replicas. Locally: that many GPUs, or that many logical CPU devices "
              "(--num_shards=8 on a laptop behaves like the 8 cores of a v3-8). Default: all devices."),
    Flag("iterations", "integer", RUNS, key="train.iterations", bound=Integer(1, MAX_ITERATIONS),
         help="Training steps per host loop, run in-graph by one tf.function call (TPUEstimator's "
              "iterations_per_loop). Config key train.iterations."),
    Flag("batch_size", "integer", RUNS, key="train.batch_size", bound=Batch(),
         help="Global training batch size, split evenly across replicas. Config key train.batch_size."),
    Flag("eval_batch_size", "integer", RUNS, key="eval.batch_size", bound=Batch(),
         help="Global eval batch size. Config key eval.batch_size."),
    Flag("predict_batch_size", "integer", RUNS, key="predict.batch_size", bound=Integer(1, MAX_PREDICT_BATCH),
         help="Global predict batch size. Config key predict.batch_size."),
    Flag("train_steps", "integer", RUNS, key="train.steps", bound=Integer(0, MAX_STEPS),
         help="Total training steps (max_steps: a resumed run continues up to it). Config key "
              "train.steps."),
    Flag("train_epochs", "float", RUNS, key="train.epochs", bound=Number(0, MAX_EPOCHS, "epochs", " (0 = count in --train_steps)"),
         help="How long to train in epochs instead of --train_steps (one of them): the steps are "
              "ceil(epochs x training examples / (batch size x accumulate_steps)), counted from the "
              "model's train_arrays or config.data.train_examples. Config key train.epochs."),
    Flag("eval_steps", "integer", RUNS, key="eval.steps", bound=Integer(0, MAX_STEPS, " (0 = one exact pass)"),
         help="Eval batches to run; 0 (the default) is one exact pass over the eval data. Config key "
              "eval.steps."),
    Flag("seed", "integer", RUNS, key="seed", bound=Integer(0, MAX_SEED),
         help="Random seed (weights, shuffling). Config key seed."),
    Flag("precision", "enum", RUNS, key="precision", choices=PRECISIONS,
         help="Keras precision policy: float32, mixed_bfloat16 (TPU native; 16-bit compute, float32 "
              "variables) or mixed_float16 (GPUs, with dynamic loss scaling). Config key precision."),
    Flag("data_dir", "string", RUNS, key="data.data_dir", some_configs=True,
         help="Directory of the model's data files (local or gs://), e.g. the train-*.tfrecord and "
              "test-*.tfrecord files of mnist. Config key data.data_dir, for configs that have it."),
    Flag("save_checkpoints_steps", "integer", TRAIN, key="train.save_checkpoints_steps", bound=Integer(0, MAX_STEPS, OFF),
         help="Save a checkpoint every this many steps (rounded up to a multiple of --iterations; 0 ="
              " by time only). Config key train.save_checkpoints_steps."),
    Flag("save_checkpoints_secs", "integer", TRAIN, key="train.save_checkpoints_secs", bound=Integer(0, MAX_SECONDS, OFF),
         help="Save a checkpoint when this many seconds passed since the last one, checked after "
              "every host loop; with --save_checkpoints_steps, whichever comes first (0 = by steps "
              "only). Config key train.save_checkpoints_secs."),
    Flag("keep_checkpoint_max", "integer", TRAIN, key="train.keep_checkpoint_max", bound=Integer(1, MAX_CHECKPOINTS_KEPT),
         help="Keep this many most recent checkpoints (the best one is kept apart, see --eval_every)."
              " Config key train.keep_checkpoint_max."),
    Flag("warm_start_from", "string", TRAIN + CHECK, key="train.warm_start_from",
         help="Initialise the model from a checkpoint, then train from step 0: tpurun's (a ckpt-N "
              "or a model_dir) or a TPUEstimator's (a model.ckpt-N prefix, a model_dir, a SavedModel),"
              " read through config.name_map; only variables matching config.train.warm_start_vars "
              "(a regex, default all) are taken. check: print the mapping. Config key "
              "train.warm_start_from."),
    Flag("force_resume", "bool", TRAIN, default=False, field=True,
         help="Resume from model_dir's checkpoint even though this config changes the model or the "
              "batch size (tpurun refuses and lists the differences otherwise)."),
    Flag("force_takeover", "bool", TRAIN, default=False, field=True,
         help="Take model_dir's trainer lease even though another tpurun train holds it: only for a "
              "trainer known to be gone on another machine before its lease went stale."),
    Flag("hang_timeout", "float", TRAIN, default=3600, bound=Number(0, MAX_SECONDS, note=" (0 = never)"), field=True,
         help="Exit with an error when a host loop (or a save) makes no progress for this many "
              "seconds (a stuck infeed or TPU) instead of hanging forever; 0 = never."),
    Flag("profile_steps", "string", TRAIN, field=True, parse=parse_step_range,
         help="START,END: capture a TensorFlow profiler trace of these steps (whole host loops) into "
              "model_dir/plugins/profile, for TensorBoard's profile tab."),
    Flag("eval_every", "string", TRAIN, key="train.eval_every", bound=StepsOrEpoch(Integer(0, MAX_STEPS, OFF)), parse=parse_eval_every,
         help="Evaluate (one exact pass) every this many steps and at the end, in the training "
              "process (rounded up to a multiple of --iterations; 0 = never), or 'epoch': at the end "
              "of every epoch (host loops end there). Config key train.eval_every."),
    Flag("max_restarts", "integer", TRAIN, default=0, bound=Integer(0, MAX_RESTARTS),
         help="train: run the trainer in a child process and resume it in a fresh one, up to this "
              "many times, when it dies without finishing (killed by a signal tpurun did not get, a "
              "lost TPU worker or unreachable storage (exit 69), its hang watchdog (exit 3), a "
              "preemption (exit 75) tpurun did not ask for). 0: train in this process."),
    Flag("split", "string", EVAL, key="eval.split",
         help="eval: the split to evaluate, one of the model's eval_splits (e.g. val, test); results "
              "go to eval/<split>/. Only config.eval.best_split updates best/. Default: "
              "config.eval.split, else the best_split. Config key eval.split."),
    Flag("continuous", "bool", EVAL, default=False, field=True,
         help="eval: watch model_dir and evaluate every new checkpoint once (a sidecar evaluator); "
              "stop after the final step (--train_steps) or after --eval_timeout without a new one."),
    Flag("eval_timeout", "float", EVAL, default=3600, bound=Number(0, MAX_SECONDS, note=" (0 = never)"), field=True,
         help="eval --continuous: stop after this many seconds without a new checkpoint."),
    Flag("input", "string", PREDICT, key="predict.input",
         help="predict: a file of rows to predict (for iris: a CSV with the four feature columns). "
              "Default: the model's own examples. Config key predict.input."),
    Flag("output", "string", PREDICT, key="predict.output",
         help="predict: write the predictions here instead of printing: one JSON line per input row, "
              "or by the extension .npz (an array per prediction) or .png (a grid of the predicted "
              "images, e.g. a generator's samples). Config key predict.output."),
    Flag("prompt", "string", PREDICT, key="predict.prompt", some_configs=True,
         help="predict: the text a generative model continues (shakespeare). Config key "
              "predict.prompt, for configs that have it."),
    Flag("export_dir", "string", EXPORT, field=True,
         help="export: directory for the SavedModel. Default: <model_dir>/export/<timestamp>."),
    Flag("best", "bool", EVAL + PREDICT + EXPORT, default=False, field=True,
         help="eval/predict/export: the best checkpoint by config.eval.best_metric on "
              "config.eval.best_split (kept in model_dir/best by evaluations) instead of the latest; "
              "eval --best records its results in best/results-<split>.json."),
    Flag("checkpoint", "string", EVAL + PREDICT + EXPORT, field=True, parse=parse_checkpoint,
         help="eval/predict/export: the checkpoint ckpt-N of model_dir (--checkpoint=ckpt-N or "
              "--checkpoint=N) instead of the latest; or the path of one outside it (another run's, "
              "a TPUEstimator's model.ckpt-N, model_dir or SavedModel, read through "
              "config.name_map), reported at its global_step."),
    Flag("target", "string", CHECK, field=True,
         help="check: a Cloud TPU accelerator type (v2-8, v3-8, v4-8, v5litepod-8 or v5e-8, v5p-8, "
              "v6e-8, or a larger slice): also size each step's memory per replica on it, compiled by"
              " the TPU's own compiler (pip install 'tpurun[tpu-compile]'; else XLA's CPU estimate), "
              "fail if one does not fit, and bound each step's time and the run's price."),
    Flag("report", "string", CHECK, field=True,
         help="check --target: also write each step's memory and bounds as JSON to this file (local "
              "or gs://)."),
    Flag("price_per_chip_hour", "float", CHECK, bound=Number(0, MAX_PRICE, "$ per chip-hour", above=True), field=True,
         help="check --target: the $ per chip-hour the run's cost bound uses, instead of the "
              "generation's on-demand list price (e.g. your region's, or a committed-use price)."),
    Flag("input_check", "bool", CHECK, default=True, field=True,
         help="check --target: also run the model's training input here for a few seconds and say "
              "whether the target's hosts would keep its chips fed (false: skip it)."),
    Flag("compile_timeout", "float", CHECK, default=600, bound=Number(0, MAX_SECONDS, above=True), field=True,
         help="check --target: seconds the TPU compiler may take for one step before check stops it "
              "and sizes that step by XLA's CPU estimate (a full-size model's train step can take "
              "over 10 minutes on a small machine's CPU)."),
    Flag("json", "bool", REPORT, default=False,
         help="report: print the report as one JSON object instead of a table."),
    Flag("port", "integer", SERVE, bound=Integer(1, MAX_PORT),
         help="data-service: the port the server listens on (all interfaces). Default: 5050 for "
              "the dispatcher, 5051 for a worker."),
    Flag("work_dir", "string", SERVE, words=("dispatcher",),
         help="data-service dispatcher: a directory (local or gs://) where the dispatcher journals"
              " its datasets and jobs, so that a restarted dispatcher carries on with them "
              "(fault-tolerant mode). Default: none; a restart forgets every job."),
    Flag("dispatcher", "string", SERVE, words=("worker",),
         help="data-service worker: the dispatcher's HOST:PORT (required)."),
    Flag("worker_address", "string", SERVE, words=("worker",),
         help="data-service worker: the host name or IP the trainers reach this worker at. "
              "Default: this machine's fully qualified name."),
)
# fmt: on
FLAG = {flag.name: flag for flag in FLAGS}
# Config keys no flag sets, and their bounds.
KEY_BOUNDS: Mapping[str, Bound] = {
    "train.accumulate_steps": Integer(1, MAX_ACCUMULATE_STEPS),
    "train.device_data": Boolean(),
    "train.xla": BooleanOrWord("auto"),
    "train.deterministic": BooleanOrWord("auto"),
    "train.async_checkpoint": Boolean(),
    "train.summary_upload_secs": Number(0, MAX_SECONDS, note=" (0 = after every host loop)"),
    "train.device_data_mb": Number(0, MAX_DEVICE_DATA_MB, "MB", " (0 = automatic)"),
}

# Each command's flags, in the table's order: what it takes and what its --help lists.
COMMAND_FLAGS = {
    command.name: tuple(flag.name for flag in FLAGS if command.name in flag.commands)
    for command in command_table.COMMANDS
}
# Flag name -> the dotted config key it sets.
FLAG_TO_CONFIG_KEY = {flag.name: flag.key for flag in FLAGS if flag.key}
# Flags for keys that only some configs have (not in base_config): given to a config
# without the key they are an error, left unset they are fine.
MODEL_SPECIFIC_FLAGS = tuple(flag.name for flag in FLAGS if flag.some_configs)
# Always accepted: absl's own (logging, flagfile, help).
ABSL_FLAGS = ("flagfile", "verbosity", "v", "logtostderr", "alsologtostderr", "log_dir")


def check_config(config: Any) -> None:
    """Every config value a flag sets, and every bounded key no flag sets, within its bound."""
    for flag in FLAGS:
        if flag.key and flag.bound is not None and not flag.some_configs:
            flag.check(_get(config, flag.key))
    for key, bound in KEY_BOUNDS.items():
        bound.check(f"config.{key}", _get(config, key))


def check_run(run: Any) -> None:
    """Every RunConfig field a flag fills within its bound (None: not given, no bound)."""
    for flag in FLAGS:
        if flag.field and flag.bound is not None:
            value = getattr(run, flag.name)
            if value is not None:
                flag.check(value)


def _get(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part]
    return node
