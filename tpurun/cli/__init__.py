"""The front door: `tpurun <command> [flags]` -> a RunConfig -> the command; no TensorFlow before it.

`--help`, `list`, `report` and every flag or config error answer before TensorFlow
loads; every failure ends as one line on stderr and an exit code.

* `main`: `main(argv)` and the console script's `run`: parse, run the command, exit;
* `parse`: the command line parsed as `main` does, running nothing (the docs' commands
  are checked through `parse_command_line`);
* `usage`: `tpurun --help` and each command's `--help`, from the command and flag tables;
* `handles`: the absl flags, defined from the flag table;
* `model_free`: the commands that run no model, `list`, `report` and `data-service` (a
  tf.data service's server);
* `terminal`: TensorFlow's start-up lines kept off the terminal.
"""

from __future__ import annotations

from tpurun.cli.main import main, run
from tpurun.cli.parse import FLAGS, Invocation, parse, parse_command_line
from tpurun.cli.usage import COMMAND_HELP, USAGE, command_help

__all__ = [
    "COMMAND_HELP",
    "FLAGS",
    "USAGE",
    "Invocation",
    "command_help",
    "main",
    "parse",
    "parse_command_line",
    "run",
]
