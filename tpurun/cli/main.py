"""`tpurun <command> [flags]`: parse, run the command, exit; every failure one line and a code.

Failures end as one line on stderr and an exit code (2: usage, 1: run failure);
`--verbosity=1` adds the traceback. Nothing imports TensorFlow before a command that
runs a model does (`tpurun.commands`, imported then).
"""

from __future__ import annotations

import gc
import logging as std_logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence

from absl import logging
from absl.logging import converter

from tpurun import __version__, errors, supervisor, tpu_vm
from tpurun.cli import handles, terminal
from tpurun.cli.parse import FLAGS, parse_command_line
from tpurun.cli.usage import COMMAND_HELP, HELP_FOOTER, USAGE, command_help
from tpurun.errors import TpurunError, tf_errors
from tpurun.run_config.command_table import COMMAND


def run() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv))


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
        run_config = invocation.run_config
        if run_config is None:  # a command of no model config: list, report, data-service
            return int(COMMAND[command].function()(*invocation.words))
        # Before TensorFlow, and before a supervisor starts trainers: a libtpu that would abort
        # TensorFlow, and a pod slice's rules (docs/tpu.md, Pod slices).
        tpu_vm.prepare(argv, run_config)
        # --max_restarts: a flag of train's only (0, its default, elsewhere).
        if supervisor.wanted(handles.value("max_restarts")):
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
