"""What `tpurun --help` and `tpurun <command> --help` print: the commands, and a command's flags."""

from __future__ import annotations

import textwrap

from absl import flags

from tpurun.run_config.command_table import COMMANDS
from tpurun.run_config.flag_table import COMMAND_FLAGS

FLAGS = flags.FLAGS


# Each command's line of `tpurun --help`, in the table's order.
COMMAND_HELP = {command.name: command.help for command in COMMANDS}
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
