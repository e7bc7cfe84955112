"""How a trainer process ended, and whether `--max_restarts` resumes it: `Ending`."""

from __future__ import annotations

import dataclasses
import signal

from tpurun.errors import EXIT_HUNG, EXIT_OK, EXIT_PREEMPTED, EXIT_UNAVAILABLE

# Exit codes that mean "resume me": the failure passes by itself.
RESTARTED_CODES = {
    EXIT_UNAVAILABLE: "lost a TPU worker or cluster peer, or its storage stayed unreachable "
    f"(exit {EXIT_UNAVAILABLE})",
    EXIT_HUNG: f"made no progress for --hang_timeout and was ended by its watchdog (exit {EXIT_HUNG})",
    EXIT_PREEMPTED: f"was preempted (SIGTERM from the system; exit {EXIT_PREEMPTED})",
}


@dataclasses.dataclass(frozen=True)
class Ending:
    """A trainer's end: its `returncode` as subprocess gives it (-N: killed by signal N)."""

    returncode: int

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def finished(self) -> bool:
        return self.returncode == EXIT_OK

    def restartable(self, asked_to_stop: bool) -> bool:
        """Whether a fresh trainer should resume: a death tpurun did not ask for (a signal,
        a transient failure, a preemption it did not forward). Never after a stop tpurun
        forwarded, a usage or config error (2), a run failure such as a NaN (1), success."""
        if asked_to_stop:
            return False
        return self.returncode < 0 or self.returncode in RESTARTED_CODES

    def what(self) -> str:
        """'the trainer was killed by SIGKILL', '... exited 1'."""
        if self.signal_name:
            return f"the trainer was killed by {self.signal_name}"
        if self.returncode in RESTARTED_CODES:
            return f"the trainer {RESTARTED_CODES[self.returncode]}"
        return f"the trainer exited {self.returncode}"

    @property
    def exit_code(self) -> int:
        """tpurun's own exit code for this end: the trainer's, 128+N for signal N (as a shell)."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode
