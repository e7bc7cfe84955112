"""A command line parsed as `main` does, running nothing: absl's flags, the config file and
its `--config.<key>` overrides, into one RunConfig (or a command's own flags); every
error a UsageError line that says the fix."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Sequence
from typing import Literal

from absl import flags
from ml_collections import config_flags

from tpurun.cli import handles
from tpurun.errors import UsageError
from tpurun.foreign import name_map
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.run_config.command_table import COMMAND, ModelDir, Parses
from tpurun.run_config.flag_table import ABSL_FLAGS, COMMAND_FLAGS, FLAG, FLAG_TO_CONFIG_KEY
from tpurun.run_config.flag_table import FLAGS as FLAGS_TABLE

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Invocation:
    """What a command line asks for, parsed and validated, before anything runs.

    `action` is one of "usage" (print the usage; an error without a command),
    "version", "help" (a command's flags) or "run" (with `run_config` for a command
    that parses a model config; the others read their flags' handles, and are called
    with `words`: the word a command's row takes first, as given).
    """

    command: str
    action: Literal["usage", "version", "help", "run"]
    run_config: RunConfig | None = None
    words: tuple[str, ...] = ()


def parse_command_line(argv: Sequence[str]) -> Invocation:
    """Parses `tpurun <command> [flags]` as `main` does, running nothing; raises UsageError.

    The docs' commands are checked through it (tests/test_docs_commands.py): a
    flag or config key renamed here fails that test, not a user.
    """
    command = argv[1] if len(argv) > 1 else ""
    if command in ("", "-h", "--help", "help", "--helpfull"):
        return Invocation(command, "usage")
    if command == "--version":
        return Invocation(command, "version")
    if command not in COMMAND:
        raise UsageError(
            f"unknown command {command!r}; use one of {', '.join(COMMAND)} (`tpurun --help`)"
        )
    args = list(argv[2:])
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in args):
        return Invocation(command, "help")
    parses = COMMAND[command].parses
    if parses is Parses.CONFIG:
        return Invocation(command, "run", parse(command, [argv[0], *args]))
    if parses is Parses.FLAGS:
        return Invocation(command, "run", words=parse_own_flags(command, [argv[0], *args]))
    return Invocation(command, "run")


def parse(command: str, argv: list[str]) -> RunConfig:
    """Parses flags and config into a RunConfig, or raises UsageError."""
    _forget_earlier_parse()
    try:
        # Expand --flagfile first so a --config inside it is resolved like one on the line.
        argv = FLAGS.read_flags_from_files(argv, force_gnu=True)
    except flags.Error as e:
        # absl words it "ERROR:: Unable to open flagfile: ..."; the prefix says nothing.
        raise UsageError(_one_line(str(e).replace("ERROR::", ""))) from None
    argv, source = _resolve_config_arg(argv)
    defaults = config_files.load(source)
    config_files.check_override_keys(defaults, argv)
    handles.CONFIG_ARGV[:] = argv  # where config_flags finds the --config.<key> overrides
    try:
        _parse_flags(command, argv)
    except (AttributeError, KeyError, ValueError, OSError) as e:
        raise UsageError(f"--config: {_one_line(str(e))}") from None
    except SystemExit as e:  # the config file, imported again by config_flags, exited
        raise UsageError(
            f"config file {source.path} exited while loading "
            f"({config_files.exit_text(e)}); remove the exit"
        ) from None
    allowed = set(COMMAND_FLAGS[command]) | set(ABSL_FLAGS)
    for name in FLAGS:
        if FLAGS[name].present and name not in allowed and not name.startswith("config."):
            takers = [c for c, names in COMMAND_FLAGS.items() if name in names]
            raise UsageError(
                f"--{name} does not apply to `tpurun {command}`; drop it"
                + (f" (it is a flag of `tpurun {' / '.join(takers)}`)" if takers else "")
            )

    FLAG["max_restarts"].check(handles.value("max_restarts"))
    flag_values = {name: FLAGS[name].value for name in FLAG_TO_CONFIG_KEY}
    overridden = config_flags.get_override_values(FLAGS["config"])  # --config.<key>=...
    config_files.check_override_types(defaults, overridden)
    config = merge_flags(handles.CONFIG.value, flag_values, overridden)
    model_dir = handles.value("model_dir")
    if model_dir is None:
        model_dir = os.path.join(os.getcwd(), source.name)
        if COMMAND[command].model_dir is not ModelDir.NONE:  # check has none
            print(f"tpurun {command}: --model_dir not set, using {model_dir}", file=sys.stderr)
    use_tpu = handles.value("use_tpu")
    tpu = handles.value("tpu") or None
    if tpu is None and use_tpu is not False:
        # Not with --use_tpu=false: a TPU_NAME left in the environment must not turn
        # an explicit local run into a "--tpu contradicts --use_tpu=false" error.
        tpu = os.environ.get("TPU_NAME") or None
    # The RunConfig fields the flags fill (the table's `field` rows), as values.
    fields = {
        flag.name: flag.value_of(handles.value(flag.name)) for flag in FLAGS_TABLE if flag.field
    }
    given = {*overridden, *(FLAG_TO_CONFIG_KEY[n] for n, v in flag_values.items() if v is not None)}
    run = RunConfig(
        command=command,
        config_name=source.name,
        config=config,
        model_dir=model_dir,
        tpu=tpu,
        given_keys=tuple(sorted(given)),
        **fields,
    )
    if run.config.train.warm_start_from or isinstance(run.checkpoint, str):
        # A rule that does not parse fails here, before TensorFlow loads.
        name_map.parse(run.config.get(name_map.CONFIG_KEY, ()))
    return run


def parse_own_flags(command: str, argv: list[str]) -> tuple[str, ...]:
    """The flags of a command that takes no model config (`report`, `data-service`), parsed
    into their handles and checked, each within its bound; the word its row's `words` takes
    first (data-service's role), checked too, if it takes one. Raises UsageError. What
    the flags require (report's --model_dir) is the command's function's to refuse."""
    words: tuple[str, ...] = ()
    shown = command
    takes = COMMAND[command].words
    if takes is not None:
        word = argv[1] if len(argv) > 1 else ""
        if word not in takes.choices:
            raise UsageError(
                f"tpurun {command} needs a {takes.what} first, {' or '.join(takes.choices)} "
                f"(got {word or 'none'!r}): e.g. {takes.example}"
            )
        argv, words, shown = [argv[0], *argv[2:]], (word,), f"{command} {word}"
    _forget_earlier_parse()
    _parse_flags(command, argv)
    allowed = set(COMMAND_FLAGS[command]) | set(ABSL_FLAGS)
    for name in (name for name in FLAGS if FLAGS[name].present):
        flag = FLAG.get(name)
        if name not in allowed:
            raise UsageError(f"--{name} does not apply to `tpurun {shown}`; drop it")
        if flag is None:  # absl's own (--verbosity, --flagfile)
            continue
        if words and flag.words and words[0] not in flag.words:
            raise UsageError(
                f"--{name} does not apply to `tpurun {shown}` (a flag of the "
                f"{' / '.join(flag.words)}); drop it"
            )
        flag.check(handles.value(name))
    return words


def _parse_flags(command: str, argv: list[str]) -> None:
    """absl's parse of `argv` into the flags' handles, its errors as one UsageError each;
    a positional argument left over is one too."""
    try:
        leftover = FLAGS(argv)
    except flags.UnrecognizedFlagError as e:
        # absl's "Unknown command line flag 'x'" does not say where the valid ones are.
        close = difflib.get_close_matches(e.flagname, COMMAND_FLAGS[command], n=1)
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise UsageError(
            f"unknown flag --{e.flagname}{hint}; `tpurun {command} --help` lists the flags"
        ) from None
    except flags.IllegalFlagValueError as e:
        raise UsageError(_bad_value(str(e))) from None
    except flags.Error as e:
        raise UsageError(_one_line(str(e))) from None
    if len(leftover) > 1:
        raise UsageError(f"unexpected arguments {leftover[1:]}; flags are written --name=value")


def _forget_earlier_parse() -> None:
    """Makes a second parse in one process (cli.main called again) start from scratch.

    absl keeps the values and `present` of the last parse, and config_flags the
    `--config.<key>` flags it defined for that parse's overrides, which defining
    them again for the same key would reject as a duplicate.
    """
    FLAGS.unparse_flags()
    for name in [name for name in FLAGS if name.startswith("config.")]:
        delattr(FLAGS, name)


def _resolve_config_arg(argv: list[str]) -> tuple[list[str], config_files.ConfigSource]:
    """Replaces every `--config` by one `--config=<path>`; as with any flag, the last wins."""
    spec = "iris"
    kept = [argv[0]]
    args = iter(argv[1:])
    for arg in args:
        if arg.startswith("--config="):
            spec = arg[len("--config=") :]
        elif arg == "--config":
            spec = next(args, "")
        else:
            kept.append(arg)
    source = config_files.resolve(spec)
    return [kept[0], f"--config={source.flag_value}", *kept[1:]], source


_FLAG_TYPES = {"int": "an integer", "float": "a number", "bool": "true or false"}


def _bad_value(message: str) -> str:
    """absl's "flag --x=v: <parser error>", plus what --x takes (the fix)."""
    message = _one_line(message)
    match = re.match(r"flag --([\w.]+)=", message)
    name = match.group(1) if match else None
    kind = _FLAG_TYPES.get(FLAGS[name].flag_type()) if name and name in FLAGS else None
    return f"{message}; --{name} takes {kind}" if kind else message


def _one_line(message: str) -> str:
    return " ".join(message.split())
