"""The command-line flags as absl flag handles, defined from `tpurun.run_config.flag_table`.

Defined on absl's global FLAGS when this module is imported. Flags that mirror a
config key default to None, meaning "keep the config's value". `value(name)` reads
one after a parse; `CONFIG` is ml_collections' `--config` (the config file and its
`--config.<key>` overrides).
"""

from __future__ import annotations

from typing import Any

from absl import flags
from ml_collections import config_flags

from tpurun.run_config import flag_table
from tpurun.run_config.flag_table import FLAG, Flag

# The argv config_flags reads the `--config.<key>` overrides from. Without it,
# config_flags reads sys.argv itself: at import time (so a missing --flagfile
# crashed with a traceback before main() could catch it), and at parse time
# (so `--config.x=v --config=iris` was an ordering error, and main(argv) ignored
# its argv). cli.parse fills it with the argv it parses.
CONFIG_ARGV: list[str] = []
CONFIG = config_flags.DEFINE_config_file(
    "config", None, FLAG["config"].help, lock_config=True, sys_argv=CONFIG_ARGV
)


def _define(flag: Flag) -> flags.FlagHolder[Any]:
    """The absl flag of a table row."""
    if flag.kind == "enum":
        return flags.DEFINE_enum(flag.name, flag.default, list(flag.choices), flag.help)
    if flag.kind == "integer":
        return flags.DEFINE_integer(flag.name, flag.default, flag.help)
    if flag.kind == "float":
        return flags.DEFINE_float(flag.name, flag.default, flag.help)
    if flag.kind == "bool":
        return flags.DEFINE_bool(flag.name, flag.default, flag.help)
    return flags.DEFINE_string(flag.name, flag.default, flag.help)


HANDLES = {flag.name: _define(flag) for flag in flag_table.FLAGS if flag.kind != "config"}


def value(name: str) -> Any:
    """The parsed value of flag `name` (its default when not given)."""
    return HANDLES[name].value
