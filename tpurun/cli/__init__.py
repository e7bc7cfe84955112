"""`tpurun <command> [flags]`: parse the command line, build the run config, run, exit.

Nothing here imports TensorFlow: `--help`, `list` and every flag or config error
answer before it loads. Failures end as one line on stderr and an exit code
(2: usage, 1: run failure); `--verbosity=1` adds the traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import gc
import logging as std_logging
import os
import re
import signal
import sys
import textwrap
import traceback
from collections.abc import Sequence
from typing import Literal

from absl import flags, logging
from absl.logging import converter
from ml_collections import config_flags

from tpurun import __version__, errors, supervisor, tpu_vm
from tpurun.cli import handles, terminal
from tpurun.errors import TpurunError, UsageError, tf_errors
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.run_config.flag_table import ABSL_FLAGS, COMMAND_FLAGS, FLAG, FLAG_TO_CONFIG_KEY
from tpurun.run_config.flag_table import FLAGS as FLAGS_TABLE

FLAGS = flags.FLAGS

COMMAND_HELP = {
    "train": "train the model; resumes from the latest checkpoint in --model_dir",
    "eval": "evaluate the latest checkpoint (--best, --checkpoint=N: another; --continuous: "
    "every new one) on one split (--split), one exact pass",
    "predict": "predict with the latest checkpoint (--best, --checkpoint=N: another); one "
    "output per input row, in order",
    "export": "export the latest (--best, --checkpoint=N: another) checkpoint as a SavedModel "
    "for serving",
    "list": "list the registered configs, and the config files in this directory",
    "check": "find what a TPU would reject: trace the steps on the CPU as on a v3-8 "
    "(--target=v5e-8: and whether each fits its memory)",
    "report": "where a model_dir's training time went: goodput, badput by category, "
    "restarts, FLOPs and MFU, from its run records (--json: for a machine)",
    "data-service": "a tf.data service's server, to train with --config.data.service: "
    "`data-service dispatcher [--port=5050] [--work_dir=gs://...]` or `data-service worker "
    "--dispatcher=HOST:5050 [--port=5051]`",
}
USAGE = "usage: tpurun <command> [--flags]\n\ncommands:\n" + "".join(
    f"  {name:<8} {text}\n" for name, text in COMMAND_HELP.items()
)
HELP_FOOTER = (
    "\n`tpurun <command> --help` lists the flags of a command. Examples:\n"
    "  tpurun train --config=iris --use_tpu=false --num_shards=8\n"
    "  tpurun eval  --config=iris\n"
    "  tpurun train --config=iris --tpu=my-tpu --tpu_zone=us-central1-b "
    "--gcp_project=my-project --model_dir=gs://bucket/iris\n"
)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv))


@dataclasses.dataclass(frozen=True)
class Invocation:
    """What a command line asks for, parsed and validated, before anything runs.

    `action` is one of "usage" (print the usage; an error without a command),
    "version", "help" (a command's flags), "list", "report" (with `report`), "serve" (with
    `serving`: a tf.data service's server) or "run" (with `run_config`).
    """

    command: str
    action: Literal["usage", "version", "help", "list", "report", "serve", "run"]
    run_config: RunConfig | None = None
    report: ReportRequest | None = None
    serving: ServeRequest | None = None


@dataclasses.dataclass(frozen=True)
class ReportRequest:
    """`tpurun report`'s flags: whose records, and in which form."""

    model_dir: str
    as_json: bool


@dataclasses.dataclass(frozen=True)
class ServeRequest:
    """`tpurun data-service ROLE`'s flags: which server, where, for which dispatcher."""

    role: Literal["dispatcher", "worker"]
    port: int
    work_dir: str = ""  # dispatcher: its journal (fault-tolerant mode); "" = none
    dispatcher: str = ""  # worker: HOST:PORT
    worker_address: str = ""  # worker: the host trainers dial; "" = this machine's name


SERVER_ROLES = {
    "dispatcher": ("port", "work_dir"),
    "worker": ("dispatcher", "port", "worker_address"),
}
DEFAULT_PORTS = {"dispatcher": 5050, "worker": 5051}


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
    if command not in COMMAND_HELP:
        raise UsageError(
            f"unknown command {command!r}; use one of {', '.join(COMMAND_HELP)} (`tpurun --help`)"
        )
    args = list(argv[2:])
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in args):
        return Invocation(command, "help")
    if command == "list":
        return Invocation(command, "list")
    if command == "report":
        return Invocation(command, "report", report=parse_report([argv[0], *args]))
    if command == "data-service":
        return Invocation(command, "serve", serving=parse_serving([argv[0], *args]))
    return Invocation(command, "run", parse(command, [argv[0], *args]))


def main(argv: Sequence[str]) -> int:
    # SIGTERM before training: exit 75 (already so from the first line under __main__); the
    # handler before is put back after, for a program that called main (the tests).
    previous = errors.stop_at_sigterm()
    try:
        return _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)  # type: ignore[arg-type]


def _main(argv: Sequence[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    try:
        invocation = parse_command_line(argv)
        if invocation.action == "usage":
            print(USAGE + HELP_FOOTER)
            return 0 if command else 2
        if invocation.action == "version":
            print(f"tpurun {__version__}")
            return 0
        if invocation.action == "help":
            print(command_help(command))
            return 0
        if invocation.action == "list":
            return list_configs()
        if invocation.action == "report":
            return show_report(invocation.report)
        if invocation.action == "serve":
            return serve(invocation.serving)
        run_config = invocation.run_config
        assert run_config is not None  # action "run" always has one
        # Before TensorFlow, and before a supervisor starts trainers: a libtpu that would abort
        # TensorFlow, and a pod slice's rules (docs/tpu.md, Pod slices).
        tpu_vm.prepare(argv, run_config)
        if command == "train" and supervisor.wanted(handles.value("max_restarts")):
            # The trainer runs in child processes; this one imports no TensorFlow.
            return supervisor.supervise(list(argv), run_config, handles.value("max_restarts"))
        logging.use_absl_handler()
        # Progress lines (INFO) go to stderr unless --verbosity says otherwise.
        level = FLAGS.verbosity if FLAGS["verbosity"].present else logging.INFO
        std_logging.root.setLevel(converter.absl_to_standard(level))
        # Before anything imports TensorFlow: without its start-up chatter, and
        # without its C++ INFO/WARNING lines unless the user chose a level or
        # --verbosity>=1 asks for everything.
        if not _verbose():
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        terminal.quiet_tensorflow(verbose=_verbose())
        # Imported here so that everything above stays TensorFlow-free.
        from tpurun import commands

        # What the imports made lives as long as the process: kept out of the garbage
        # collector's scans (not collected first: a full collection costs what it saves).
        # Python's last collection at exit walked TensorFlow's ~350,000 objects, 1.6 to
        # 1.9 CPU-s of every tpurun process's end, a preempted one's within its notice.
        gc.freeze()
        commands.run(run_config)
        return 0
    except TpurunError as e:
        _report(command, str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _report(command, "interrupted")
        return 130
    except errors.StoppedBySigterm as e:
        _report(command, str(e))
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if errors.caused_by_sigterm(e):  # raised inside C code: a SystemError with it as cause
            stopped = errors.StoppedBySigterm()
            _report(command, str(stopped))
            return stopped.exit_code
        message, code = tf_errors.describe(e)
        _report(command, message)
        return code


# The longest error line: whatever a message quotes (a user's value, a data cell, an
# error of the user's code), the line stays one a terminal shows.
MAX_ERROR_LINE = 2000


def _report(command: str, message: str) -> None:
    prefix = f"tpurun {command}" if command in COMMAND_HELP else "tpurun"
    if _verbose():
        traceback.print_exc()
    print(f"{prefix}: error: {errors.excerpt(message, MAX_ERROR_LINE)}", file=sys.stderr)
    if (
        not _verbose()
        and sys.exc_info()[0] is not None
        and not isinstance(sys.exc_info()[1], TpurunError)
        and not errors.caused_by_sigterm(sys.exc_info()[1])
    ):
        print(f"{prefix}: (rerun with --verbosity=1 for the traceback)", file=sys.stderr)


def _verbose() -> bool:
    try:
        return FLAGS.is_parsed() and FLAGS.verbosity >= 1
    except Exception:  # noqa: BLE001 - flags may be half-parsed when we report a flag error
        return False


def command_help(command: str) -> str:
    lines = [f"usage: tpurun {command} [--flags]", "", COMMAND_HELP[command] + ".", "", "flags:"]
    for name in COMMAND_FLAGS[command]:
        flag = FLAGS[name]
        default = "" if flag.default is None else f" (default: {flag.default})"
        lines.append(f"  --{name}")
        lines.extend(
            textwrap.wrap(
                flag.help + default, 76, initial_indent="      ", subsequent_indent="      "
            )
        )
    lines.append("  --flagfile: read flags from a file, one per line.")
    lines.append("  --verbosity: absl log level; 1 or more also prints tracebacks on errors.")
    return "\n".join(lines)


def list_configs() -> int:
    names = config_files.builtin_names()
    width = max(len(n) for n in names) if names else 0
    for name in names:
        path = os.path.join(config_files.builtin_dir(), name + ".py")
        print(f"{name:<{width}}  {config_files.summary(path)}")
    local = config_files.local_configs()
    if local:
        print("\nconfig files in this directory (pass --config=<path>):")
        width = max(len(path) for path, _ in local)
        for path, summary in local:
            print(f"  {path:<{width}}  {summary}")
    return 0


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
    except (AttributeError, KeyError, ValueError, OSError) as e:
        raise UsageError(f"--config: {_one_line(str(e))}") from None
    except SystemExit as e:  # the config file, imported again by config_flags, exited
        raise UsageError(
            f"config file {source.path} exited while loading "
            f"({config_files.exit_text(e)}); remove the exit"
        ) from None
    if len(leftover) > 1:
        raise UsageError(f"unexpected arguments {leftover[1:]}; flags are written --name=value")
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
        if command != "check":  # check neither reads nor writes a model_dir
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
    return RunConfig(
        command=command,
        config_name=source.name,
        config=config,
        model_dir=model_dir,
        tpu=tpu,
        given_keys=tuple(sorted(given)),
        **fields,
    )


def parse_report(argv: list[str]) -> ReportRequest:
    """`tpurun report --model_dir=D [--json]`'s flags, checked; raises UsageError (the
    missing --model_dir is `show_report`'s to refuse)."""
    _flags_alone(argv, "report")
    allowed = set(COMMAND_FLAGS["report"]) | set(ABSL_FLAGS)
    for name in FLAGS:
        if FLAGS[name].present and name not in allowed:
            raise UsageError(f"--{name} does not apply to `tpurun report`; drop it")
    return ReportRequest(handles.value("model_dir") or "", bool(handles.value("json")))


def parse_serving(argv: list[str]) -> ServeRequest:
    """`tpurun data-service ROLE [flags]`: the role and its flags, checked; raises UsageError."""
    role = argv[1] if len(argv) > 1 else ""
    if role not in SERVER_ROLES:
        raise UsageError(
            f"tpurun data-service needs a role first, dispatcher or worker (got {role or 'none'!r}): "
            "e.g. tpurun data-service dispatcher --port=5050"
        )
    _flags_alone([argv[0], *argv[2:]], "data-service")
    for name in FLAGS:
        if FLAGS[name].present and name not in (*SERVER_ROLES[role], *ABSL_FLAGS):
            other = "worker" if role == "dispatcher" else "dispatcher"
            owner = f" (a flag of the {other})" if name in SERVER_ROLES[other] else ""
            raise UsageError(
                f"--{name} does not apply to `tpurun data-service {role}`{owner}; drop it"
            )
    port = handles.value("port") or DEFAULT_PORTS[role]
    FLAG["port"].check(port)
    dispatcher = (handles.value("dispatcher") or "").removeprefix("grpc://")
    if role == "worker" and not re.fullmatch(r"[\w.\-]+:\d{1,5}|\[[\w:.]+\]:\d{1,5}", dispatcher):
        raise UsageError(
            f"tpurun data-service worker needs --dispatcher=HOST:PORT, the dispatcher's address "
            f"(got {dispatcher or 'none'!r}), e.g. --dispatcher=10.128.0.5:5050"
        )
    return ServeRequest(
        role,  # type: ignore[arg-type]
        port,
        work_dir=handles.value("work_dir") or "",
        dispatcher=dispatcher,
        worker_address=handles.value("worker_address") or "",
    )


def _flags_alone(argv: list[str], command: str) -> None:
    """Parses the flags of a command that takes no config (report, data-service); raises
    UsageError."""
    _forget_earlier_parse()
    try:
        leftover = FLAGS(argv)
    except flags.UnrecognizedFlagError as e:
        raise UsageError(
            f"unknown flag --{e.flagname}; `tpurun {command} --help` lists the flags"
        ) from None
    except flags.IllegalFlagValueError as e:
        raise UsageError(_bad_value(str(e))) from None
    except flags.Error as e:
        raise UsageError(_one_line(str(e))) from None
    if len(leftover) > 1:
        raise UsageError(f"unexpected arguments {leftover[1:]}; flags are written --name=value")


def serve(request: ServeRequest | None) -> int:
    """Runs a tf.data service server until SIGTERM (TensorFlow loads here)."""
    assert request is not None  # action "serve" always has one
    if not _verbose():  # TensorFlow's C++ lines: a worker's log would be its retries
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    terminal.quiet_tensorflow(verbose=_verbose())
    from tpurun.data_service import servers

    return servers.serve(
        request.role,
        request.port,
        work_dir=request.work_dir,
        dispatcher=request.dispatcher,
        address=request.worker_address,
    )


def show_report(request: ReportRequest | None) -> int:
    """Prints the report of a model_dir's run records; no TensorFlow."""
    assert request is not None  # action "report" always has one
    if not request.model_dir:  # a run's, not a parse's, need: the manual names the command
        raise UsageError("tpurun report needs --model_dir: the model_dir of a training run")
    from tpurun import report

    print(report.main(request.model_dir, as_json=request.as_json))
    return 0


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
