"""`RunConfig`: one frozen, validated description of a run, and its checks by topic.

Built before TensorFlow is imported, so a bad flag fails in milliseconds. The run record
(this object, plus versions) is written to model_dir at the start of every run, so a
model_dir says how it was made.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from typing import Any

import ml_collections

from tpurun import __version__
from tpurun.errors import UsageError
from tpurun.run_config import flag_table
from tpurun.run_config.bounds import check_divisible
from tpurun.run_config.flag_table import (
    EPOCH,
    FLAG_TO_CONFIG_KEY,
    MODEL_SPECIFIC_FLAGS,
    PRECISIONS,
)
from tpurun.run_config.keys import recipe_keys, service_keys


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
    # eval/predict/export: the step of model_dir's ckpt-N instead of the latest, or the path
    # of a checkpoint outside it (tpurun.foreign.outside)
    checkpoint: int | str | None = None
    force_resume: bool = False  # train: resume even though the config changed the model
    force_takeover: bool = False  # train: take model_dir's lease from another trainer
    hang_timeout: float = 3600  # train: seconds without progress before failing; 0 = never
    profile_steps: tuple[int, int] | None = None  # train: first and last step to profile
    continuous: bool = False  # eval: evaluate every new checkpoint until the final step
    eval_timeout: float = 3600  # eval --continuous: seconds to wait for a new checkpoint
    target: str | None = None  # check: a Cloud TPU type whose memory each step must fit
    report: str | None = None  # check --target: where to write the estimate as JSON
    # The training examples an epoch counts (`epochs.resolve_length` sets it when the run
    # counts in epochs or evaluates every epoch); 0 = not counted.
    train_examples: int = 0
    price_per_chip_hour: float | None = None  # check --target: $ per chip-hour for the cost
    input_check: bool = True  # check --target: measure whether the training input keeps up
    compile_timeout: float = 600  # check --target: seconds one TPU compile may take
    # The config keys the command line set (`--config.<key>=...` and the flags of config
    # keys, `--batch_size` for train.batch_size): eval, predict and export take the
    # trained config's model keys except these (`tpurun.run_config.keys.trained_keys`).
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
    service_keys.check(run.config)  # config.data.service: a dispatcher, a mode, a timeout


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
    recipe_keys.validate(config)
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
