"""`python -m tpurun ...` and the `tpurun` command: SIGTERM is tpurun's from here on, then the CLI.

A preemption notice may come at any moment of a start-up that takes seconds (the
CLI's imports, then TensorFlow's): from the first line it ends the process with
exit 75 and one line, never by the signal (143).
"""

import sys

from tpurun import errors


def main() -> None:
    errors.stop_at_sigterm()
    try:
        from tpurun.cli import run
    except (errors.StoppedBySigterm, SystemError) as e:  # during the CLI's own imports
        if not errors.caused_by_sigterm(e):
            raise
        stopped = errors.StoppedBySigterm()
        print(f"tpurun: error: {stopped}", file=sys.stderr)
        sys.exit(stopped.exit_code)
    run()


if __name__ == "__main__":
    main()
