"""One frozen, validated description of a run: flags merged into the config.

Built before TensorFlow is imported, so bad flags fail in milliseconds. The
run record (this object, plus versions) is written to model_dir at the start of
every run, so a model_dir says how it was made.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import re
from collections.abc import Mapping
from typing import Any

import ml_collections

from tpurun import __version__
from tpurun.errors import UsageError
from tpurun.run_config import flag_table, recipe_keys
from tpurun.run_config.flag_table import (
    EPOCH,
    FLAG,
    FLAG_TO_CONFIG_KEY,
    MODEL_SPECIFIC_FLAGS,
    PRECISIONS,
)

COMMANDS = ("train", "eval", "predict", "export", "check")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run needs to know; `config` is the model's frozen config."""

    command: str
    config_name: str
    config: ml_collections.FrozenConfigDict
    model_dir: str
    use_tpu: bool | None = None  # None: use a TPU if one is configured or detected
    tpu: str | None = None
    tpu_zone: str | None = None
    gcp_project: str | None = None
    tpu_init_timeout: float = 300  # seconds to reach the TPU (or all TF_CONFIG workers)
    num_shards: int | None = None  # None: every local device (or every TPU core)
    export_dir: str | None = None
    best: bool = False  # eval/predict/export: the best checkpoint instead of the latest
    checkpoint: int | None = None  # eval/predict/export: the step of ckpt-N instead of the latest
    force_resume: bool = False  # train: resume even though the config changed the model
    force_takeover: bool = False  # train: take model_dir's lease from another trainer
    hang_timeout: float = 3600  # train: seconds without progress before failing; 0 = never
    profile_steps: tuple[int, int] | None = None  # train: first and last step to profile
    continuous: bool = False  # eval: evaluate every new checkpoint until the final step
    eval_timeout: float = 3600  # eval --continuous: seconds to wait for a new checkpoint
    target: str | None = None  # check: a Cloud TPU type whose memory each step must fit
    report: str | None = None  # check --target: where to write the estimate as JSON
    # The training examples an epoch counts (train_config.resolve_length sets it when the
    # run counts in epochs or evaluates every epoch); 0 = not counted.
    train_examples: int = 0
    price_per_chip_hour: float | None = None  # check --target: $ per chip-hour for the cost
    input_check: bool = True  # check --target: measure whether the training input keeps up
    compile_timeout: float = 600  # check --target: seconds one TPU compile may take
    # The config keys the command line set (`--config.<key>=...` and the flags of config
    # keys, `--batch_size` for train.batch_size): eval, predict and export take the
    # trained config's model keys except these (`tpurun.run_config.trained_keys`).
    given_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    # The TPUEstimator-era names, read from the one place they live: the config.
    @property
    def train_batch_size(self) -> int:
        return self.config.train.batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.config.eval.batch_size

    @property
    def predict_batch_size(self) -> int:
        return self.config.predict.batch_size

    @property
    def iterations(self) -> int:
        return self.config.train.iterations

    @property
    def train_steps(self) -> int:
        return self.config.train.steps

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def needs_examples(self) -> bool:
        """Whether the run needs its training examples counted: it counts in epochs
        (--train_epochs), evaluates every epoch (--eval_every=epoch), or its optimizer
        says a warmup or boundaries in epochs."""
        config = self.config
        return (
            bool(config.train.epochs)
            or config.train.eval_every == EPOCH
            or recipe_keys.counts_epochs(config)
        )

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["config"] = self.config.to_dict()
        return fields

    def record(self, tf_version: str) -> str:
        """The run record written to model_dir: run config plus versions, as JSON."""
        return json.dumps(
            {
                "run_config": self.to_dict(),
                "versions": {
                    "tpurun": __version__,
                    "tensorflow": tf_version,
                    "python": platform.python_version(),
                },
                "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            },
            indent=2,
            default=str,
        )


def merge_flags(
    config: ml_collections.ConfigDict,
    flag_values: dict[str, Any],
    overridden: Mapping[str, Any] | None = None,
) -> ml_collections.FrozenConfigDict:
    """Applies the flags that were given (not None) to their config keys, then freezes.

    `overridden`: the config keys given as `--config.<key>=...` and their values (already
    in `config`).
    How long to train is said once: in steps or in epochs. Given on the command line,
    it replaces the config file's choice; both there is an error.
    """
    length = _length_given(flag_values, overridden or {})
    config = ml_collections.ConfigDict(config.to_dict())  # unlocked copy; caller's stays intact
    for flag_name, key in FLAG_TO_CONFIG_KEY.items():
        value = flag_values.get(flag_name)
        if value is None:
            continue
        value = FLAG[flag_name].value_of(value)
        section, _, leaf = key.rpartition(".")
        node = config if not section else config.get(section)
        if flag_name in MODEL_SPECIFIC_FLAGS and (node is None or leaf not in node):
            raise UsageError(
                f"--{flag_name} sets config key {key}, which config {config.get('model')!r} "
                "does not have: it applies only to configs that define it; drop the flag"
            )
        if node is None or leaf not in node:
            raise UsageError(
                f"--{flag_name} sets config key {key}, which this config does not have; "
                "start the config from tpurun.config_defaults.base_config()"
            )
        if flag_name == "eval_every":
            with node.ignore_type():  # a number of steps, or "epoch"
                node[leaf] = value
        else:
            node[leaf] = value
    if length == "steps":
        config.train.epochs = 0.0  # the config file's epochs give way to the command line
    elif config.train.epochs:
        config.train.steps = 0  # derived from the epochs when the run starts
    return ml_collections.FrozenConfigDict(config)


def _length_given(flag_values: dict[str, Any], overridden: Mapping[str, Any]) -> str:
    """ "steps", "epochs" or "" (neither): how long to train, as the command line says it."""
    given: dict[str, str | None] = {}
    for name, flag, key in (
        ("steps", "train_steps", "train.steps"),
        ("epochs", "train_epochs", "train.epochs"),
    ):
        if flag_values.get(flag) is not None:
            given[name] = f"--{flag}={flag_values[flag]:g}"
        elif key in overridden:
            given[name] = f"--config.{key}={overridden[key]:g}"
        else:
            given[name] = None
    if given["steps"] and given["epochs"]:
        raise UsageError(
            f"{given['epochs']} and {given['steps']} both say how long to train: give one "
            "(in epochs, the steps are ceil(epochs x training examples / examples per step))"
        )
    return "steps" if given["steps"] else "epochs" if given["epochs"] else ""


def split_fix(batch_size: int, num_replicas: int, flag: str = "") -> str | None:
    """None when a global batch splits evenly over the replicas, else the fix to say.

    `use a multiple of 8 (e.g. 96 or 104)`; with `flag`, `(e.g. --batch_size=96 or 104)`.
    """
    if not batch_size % num_replicas:
        return None
    lower = batch_size // num_replicas * num_replicas
    upper = lower + num_replicas
    name = f"{flag}=" if flag else ""
    example = f"{name}{lower} or {upper}" if lower else f"{name}{upper}"
    return f"use a multiple of {num_replicas} (e.g. {example})"


def check_divisible(what: str, batch_size: int, num_replicas: int) -> None:
    """A global batch must split evenly: every replica (TPU core) gets the same static shape."""
    fix = split_fix(batch_size, num_replicas)
    if fix:
        raise UsageError(
            f"{what}={batch_size} is not divisible by the {num_replicas} replicas; {fix}"
        )


def aligned_to_loop(steps: int, iterations: int) -> int:
    """Rounds a step cadence up to a whole number of host loops (0 stays 0)."""
    if steps <= 0:
        return 0
    return -(-steps // iterations) * iterations


_REQUIRED_KEYS = (
    "model",
    "seed",
    *(key for flag, key in FLAG_TO_CONFIG_KEY.items() if flag not in MODEL_SPECIFIC_FLAGS),
    "train.warm_start_vars",
    "train.ema_decay",
    "train.accumulate_steps",
    "train.device_data",
    "train.device_data_mb",
    "train.xla",
    "train.deterministic",
    *(f"optimizer.{key}" for key in recipe_keys.RECIPE_KEYS),
    "eval.best_metric",
    "eval.best_mode",
)


# Config data.* keys whose value is where data live (a file, a directory, a pattern).
DATA_LOCATION_SUFFIXES = ("path", "dir", "files", "pattern")


_LOOPBACK = re.compile(r"grpc://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?")


def _local_paths(run: RunConfig) -> list[tuple[str, str]]:
    """(where it was given, path) of every path of the run on this machine's disk."""
    paths = [("--model_dir", run.model_dir), ("--export_dir", run.export_dir or "")]
    config = run.config
    paths += [
        ("--warm_start_from", config.train.warm_start_from or ""),
        ("--input", str(config.predict.get("input") or "")),
        ("--output", str(config.predict.get("output") or "")),
    ]
    data = config.get("data") or {}
    paths += [
        (f"--config.data.{key}", str(value))
        for key, value in data.items()
        if key.endswith(DATA_LOCATION_SUFFIXES) and isinstance(value, str)
    ]
    return [(flag, path) for flag, path in paths if path and "://" not in path]


def refuse_local_paths_on_a_tpu_node(run: RunConfig, address: str | None = None) -> None:
    """A TPU node's host reads data and writes checkpoints itself, through gs:// only.

    It cannot see this machine's disk: TensorFlow fails there, after the TPU was
    reached, with "File system scheme '[local]' not implemented" (tensorflow#32651).
    `address`: the node's grpc:// address once a --tpu=NAME is looked up (checked
    before connecting); without it, a --tpu=grpc:// address is checked before
    anything is written. A worker on this machine (loopback) sees its disk.
    """
    if run.command == "check" or run.use_tpu is False or not run.tpu or run.tpu == "local":
        return
    address = address or (run.tpu if run.tpu.startswith("grpc://") else None)
    if address is None or _LOOPBACK.fullmatch(address):
        return
    local = _local_paths(run)
    if local:
        flag, path = local[0]
        raise UsageError(
            f"{flag}={path} is on this machine's disk, but the TPU node --tpu={run.tpu} reads "
            "and writes through its own host, which sees only Cloud Storage (TensorFlow's "
            "\"File system scheme '[local]' not implemented\"): give a gs://BUCKET/... path, "
            "or run on a TPU VM with --tpu=local"
        )


def _validate(run: RunConfig) -> None:
    """Refuses a run that cannot be: each topic's check raises one UsageError line."""
    _require_keys(run)
    flag_table.check_config(run.config)
    flag_table.check_run(run)
    _check_recipe(run)
    _check_cluster(run)
    _check_train_flags(run)
    _check_checkpoint_choice(run)
    _check_report_flags(run)


def _require_keys(run: RunConfig) -> None:
    """Every standard section and key of base_config() is in the config."""
    for key in _REQUIRED_KEYS:
        node: Any = run.config
        for part in key.split("."):
            if part not in node:
                raise UsageError(
                    f"config {run.config_name} has no key {key}; build it from "
                    "tpurun.config_defaults.base_config() so it has every standard section"
                )
            node = node[part]


def _check_recipe(run: RunConfig) -> None:
    """The optimizer recipe, the precision and what selects the best checkpoint."""
    config = run.config
    # A run counted in epochs knows its steps once its examples are counted.
    unresolved = bool(config.train.epochs) and not run.train_examples
    recipe_keys.validate(config, train_steps=None if unresolved else config.train.steps)
    if config.precision not in PRECISIONS:
        raise UsageError(
            f"--precision={config.precision} (config.precision) is not a precision; use one of "
            f"{', '.join(PRECISIONS)}"
        )
    if config.precision == "mixed_float16" and (run.use_tpu or run.tpu):
        raise UsageError(FLOAT16_ON_TPU)
    if config.eval.best_mode not in ("min", "max"):
        raise UsageError(
            f"config.eval.best_mode={config.eval.best_mode!r} must be 'min' or 'max' "
            f"(is a smaller or a larger {config.eval.best_metric} better?)"
        )


def _check_cluster(run: RunConfig) -> None:
    """Where the run executes: the replicas its batches split over, and the TPU flags."""
    config = run.config
    if run.num_shards is not None:
        check_divisible("--batch_size", config.train.batch_size, run.num_shards)
        check_divisible("--eval_batch_size", config.eval.batch_size, run.num_shards)
        check_divisible("--predict_batch_size", config.predict.batch_size, run.num_shards)
    if run.use_tpu is False and run.tpu:
        raise UsageError(f"--tpu={run.tpu} contradicts --use_tpu=false; drop one of them")
    is_tpu_name = run.tpu and run.tpu != "local" and not run.tpu.startswith("grpc://")
    if is_tpu_name and not (run.tpu_zone and run.gcp_project):
        # Also checked by tpu.connect; here it fails before TensorFlow loads and
        # before train creates model_dir.
        raise UsageError(
            f"--tpu={run.tpu} is a TPU name: pass --tpu_zone and --gcp_project too "
            "(or --tpu=grpc://HOST:8470, or --use_tpu=false to run locally)"
        )


def _check_train_flags(run: RunConfig) -> None:
    if run.profile_steps is not None:
        first, last = run.profile_steps
        if not 1 <= first <= last:
            raise UsageError(
                f"--profile_steps={first},{last} must be START,END with 1 <= START <= END"
            )
    if not run.model_dir:
        raise UsageError("--model_dir must not be empty")


def _check_checkpoint_choice(run: RunConfig) -> None:
    """eval/predict/export: one way of choosing the checkpoint."""
    if run.best and run.checkpoint is not None:
        raise UsageError(
            f"--best and --checkpoint={run.checkpoint} each choose the checkpoint; drop one"
        )
    if run.continuous and (run.best or run.checkpoint is not None):
        chosen = "--best" if run.best else f"--checkpoint={run.checkpoint}"
        raise UsageError(
            f"eval --continuous evaluates every new checkpoint, {chosen} one: drop one of them"
        )


def _check_report_flags(run: RunConfig) -> None:
    """check: --report and --price_per_chip_hour are about --target."""
    if run.report is not None and not run.target:
        raise UsageError(
            f"--report={run.report} writes the memory estimate of --target; add "
            "--target=<TPU type> (e.g. --target=v5e-8) or drop --report"
        )
    if run.report == "":
        raise UsageError("--report must not be empty: give the JSON file to write")
    if run.price_per_chip_hour is not None and not run.target:
        raise UsageError(
            f"--price_per_chip_hour={run.price_per_chip_hour:g} prices the run on --target; add "
            "--target=<TPU type> (e.g. --target=v5e-8) or drop --price_per_chip_hour"
        )


FLOAT16_ON_TPU = (
    "--precision=mixed_float16 does not run on a TPU: TPUs compute in bfloat16, and "
    "float16's loss scaling has no TPU path; use --precision=mixed_bfloat16 (the same "
    "speed-up, no loss scaling needed)"
)
