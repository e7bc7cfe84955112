"""Every command of tpurun, once: its help line, what running it involves, and what runs it.

`tpurun --help` lists the table in its order; the flag table (`flag_table`) says which
command takes which flag; `tpurun.commands.run` reads a command's row to decide what a run
needs before the command's own function is called (model_dir, lease, strategy, counted
examples). Adding a command is adding a row and the function it names; a property every
command has is a field. Nothing here imports TensorFlow: the function is named as
"module:function" and imported only when the command runs.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Callable
from typing import Any

# A RunConfig, which `resolves_length` is asked about (not imported: run.py, which
# defines it, imports the flag table, which imports this table).
RunConfig = Any


class Parses(enum.Enum):
    """What a command line of the command is parsed into before its function runs."""

    # Flags and a model config (--config, --config.<key>=...) -> one RunConfig.
    CONFIG = "config"
    # Its own flags only (no model config): the function reads their handles.
    FLAGS = "flags"
    # Nothing: the command takes no flags.
    NOTHING = "nothing"


class ModelDir(enum.Enum):
    """What a command does with --model_dir."""

    NONE = "none"  # neither reads nor writes one
    WRITES = "writes"  # creates it if need be, and writes checkpoints
    READS = "reads"  # reads a checkpoint (the latest, --best's or --checkpoint's)


def never(run: RunConfig) -> bool:
    return False


def always(run: RunConfig) -> bool:
    return True


def final_step_in_epochs(run: RunConfig) -> bool:
    """eval --continuous waits for the trainer's final step, which its epochs make."""
    return run.continuous and bool(run.config.train.epochs)


@dataclasses.dataclass(frozen=True)
class Words:
    """The word a command line of the command takes first, before its flags: one of
    `choices` (data-service's role). The command's function is called with it; a flag
    that applies to some choices only names them (the flag table's `words`)."""

    what: str  # what the word is, as the message that asks for it says ("role")
    choices: tuple[str, ...]
    example: str  # a command line that gives one, for that message


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of tpurun and what running it involves."""

    name: str
    help: str  # its line in `tpurun --help`, and the first of `tpurun <command> --help`
    # The function that runs it, "module:function", imported when it runs (`function`):
    # - model_dir NONE, parses CONFIG (check): function(run: RunConfig);
    # - model_dir READS or WRITES: function(run: RunConfig, prepared: commands.Prepared),
    #   once `tpurun.commands.run` prepared what the row below asks for;
    # - parses FLAGS or NOTHING: function() -> exit code, reading its flags' handles;
    #   with `words`, function(word).
    runs: str
    parses: Parses = Parses.CONFIG
    words: Words | None = None  # the word its line takes first (Parses.FLAGS); None: none
    model_dir: ModelDir = ModelDir.NONE
    takes_lease: bool = False  # model_dir's trainer lease, held for the whole run (the chief's)
    keeps_account: bool = False  # the run record holds the run's time account (goodput)
    # A tf.distribute strategy over the run's replicas (the TPU's cores, or the local
    # devices); without one the command builds the model alone (export: serving has no
    # replicas; check: its own CPU replicas).
    needs_strategy: bool = False
    # Trains: TensorFlow's kernels are set by config.train.deterministic for the run, and
    # the run says whether its resume is bit-identical (`tpurun.cluster.determinism`).
    sets_kernels: bool = False
    # Runs the model's step over its data: a data error is diagnosed by the model's
    # `diagnose_data`.
    reads_data: bool = False
    # Its training input is made by the tf.data service config.data.service names, if it
    # names one (eval and predict read theirs here): that service must answer before the
    # strategy is built (`tpurun.data_service.probe`; else exit 69, nothing initialised).
    service_input: bool = False
    checks_splits: bool = False  # resolves config.eval's split names before the run record
    # Whether the run resolves how long it trains (`tpurun.run_config.epochs.resolve_length`):
    # its training examples counted when it says a length in epochs, its steps from them,
    # and a warning when it ends inside its warmup.
    resolves_length: Callable[[RunConfig], bool] = never
    # Runs on a TPU when one is given or found (`tpurun.tpu_vm.slice_rules`): a TPU
    # node's host sees no local path of it.
    on_tpu: bool = False

    def function(self) -> Callable[..., Any]:
        """The function that runs the command, imported now (it may import TensorFlow)."""
        module, _, name = self.runs.partition(":")
        return getattr(importlib.import_module(module), name)


TRAIN = Command(
    "train",
    "train the model; resumes from the latest checkpoint in --model_dir",
    "tpurun.commands.train:train",
    model_dir=ModelDir.WRITES,
    takes_lease=True,
    keeps_account=True,
    needs_strategy=True,
    sets_kernels=True,
    reads_data=True,
    service_input=True,
    checks_splits=True,
    resolves_length=always,
    on_tpu=True,
)
EVAL = Command(
    "eval",
    "evaluate the latest checkpoint (--best, --checkpoint=N or =PATH: another; --continuous: "
    "every new one) on one split (--split), one exact pass",
    "tpurun.commands.evaluate:evaluate",
    model_dir=ModelDir.READS,
    needs_strategy=True,
    reads_data=True,
    checks_splits=True,
    resolves_length=final_step_in_epochs,
    on_tpu=True,
)
PREDICT = Command(
    "predict",
    "predict with the latest checkpoint (--best, --checkpoint=N or =PATH: another); one output per "
    "input row, in order",
    "tpurun.commands.predict:predict",
    model_dir=ModelDir.READS,
    needs_strategy=True,
    reads_data=True,
    on_tpu=True,
)
EXPORT = Command(
    "export",
    "export the latest (--best, --checkpoint=N or =PATH: another) checkpoint as a SavedModel for serving",
    "tpurun.commands.export:export_command",
    model_dir=ModelDir.READS,
    on_tpu=True,
)
LIST = Command(
    "list",
    "list the registered configs, and the config files in this directory",
    "tpurun.cli.model_free:list_configs",
    parses=Parses.NOTHING,
)
CHECK = Command(
    "check",
    "find what a TPU would reject: trace the steps on the CPU as on a v3-8 "
    "(--target=v5e-8: and whether each fits its memory)",
    "tpurun.check:main",
)
REPORT = Command(
    "report",
    "where a model_dir's training time went: goodput, badput by category, restarts, "
    "FLOPs and MFU, from its run records (--json: for a machine)",
    "tpurun.cli.model_free:show_report",
    parses=Parses.FLAGS,
)
DATA_SERVICE = Command(
    "data-service",
    "a tf.data service's server, to train with --config.data.service: "
    "`data-service dispatcher [--port=5050] [--work_dir=gs://...]` or `data-service worker "
    "--dispatcher=HOST:5050 [--port=5051]`",
    "tpurun.cli.model_free:serve_data",
    parses=Parses.FLAGS,
    words=Words("role", ("dispatcher", "worker"), "tpurun data-service dispatcher --port=5050"),
)
# In the order `tpurun --help` lists them.
COMMANDS = (TRAIN, EVAL, PREDICT, EXPORT, LIST, CHECK, REPORT, DATA_SERVICE)
COMMAND = {command.name: command for command in COMMANDS}
