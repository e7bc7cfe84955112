"""`python -m tpurun ...` is the `tpurun` command."""

from tpurun.cli import run

run()
