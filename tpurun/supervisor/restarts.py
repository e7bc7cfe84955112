"""The trainer in a child process, restarted after a death (`tpurun train --max_restarts=N`).

This process imports no TensorFlow: it starts `python -m tpurun train` with the same
flags (and TPURUN_SUPERVISED, so the child trains in its own process), forwards
SIGTERM and SIGINT to it (as SIGTERM: the trainer saves and exits 75), and when the
trainer dies without finishing for a reason that passes (`exits.Ending.restartable`)
waits (a backoff; with --tpu=NAME until the Cloud TPU API says the node is READY)
and starts a fresh one, which resumes from the latest checkpoint: one line per
restart. The child tells its run record when it was started, by which supervisor
and how the one before it died (`tpurun.actions.goodput`), so `tpurun report` counts
the downtime; the record of a child that died before it wrote one is written here
(`post_mortem`). A SIGTERM or SIGINT while no trainer runs (the backoff, the wait
for a TPU) ends it with one line and exit 75 (130 for SIGINT).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from tpurun.errors import EXIT_PREEMPTED
from tpurun.layout import names, time_account
from tpurun.layout.time_account import Death, TimeAccount
from tpurun.report import run_records
from tpurun.run_config import RunConfig
from tpurun.supervisor import post_mortem, protocol, tpu_wait
from tpurun.supervisor.exits import Ending
from tpurun.supervisor.protocol import (
    PREVIOUS_DEATH_ENV,
    PROGRESS_FD_ENV,
    SPAWNED_AT_ENV,
    SUPERVISED_ENV,
    SUPERVISOR_START_ENV,
)

# tpurun's exit when a signal stops it while no trainer runs: as the trainer's would be.
STOPPED_EXIT = {signal.SIGTERM: EXIT_PREEMPTED, signal.SIGINT: 130}
# Seconds before restart k: BACKOFF * 2^(k-1), at most MAX_BACKOFF.
BACKOFF = 1.0
MAX_BACKOFF = 60.0
# In a multi-worker cluster (TF_CONFIG), at least this long: the other workers see the lost
# peer within ~10 s (TensorFlow's heartbeat) and end with exit 69; their supervisors restart
# them too, and the fresh workers wait for each other at start-up (--tpu_init_timeout).
# Restarting sooner would join a cluster whose other members are still the old ones.
MULTI_WORKER_SETTLE = 30.0


def wanted(max_restarts: int) -> bool:
    """Whether this `tpurun train` supervises a child: asked for, and not itself that child."""
    return max_restarts > 0 and not os.environ.get(SUPERVISED_ENV)


def child_argv(argv: Sequence[str]) -> list[str]:
    """The child's command: `python -m tpurun` and argv's flags without --max_restarts."""
    flags, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--max_restarts":
            skip = True
            continue
        if arg.startswith("--max_restarts="):
            continue
        flags.append(arg)
    return [sys.executable, "-m", "tpurun", *flags]


def supervise(argv: Sequence[str], run: RunConfig, max_restarts: int) -> int:
    """Runs the trainer until it finishes, fails for good, is stopped, or the restarts are spent;
    tpurun's exit code."""
    return Supervisor(child_argv(argv), run, max_restarts).run()


class Supervisor:
    def __init__(self, command: list[str], run: RunConfig, max_restarts: int):
        self.command = command
        self.run_config = run
        self.max_restarts = max_restarts
        self.child: subprocess.Popen | None = None
        self.stop = threading.Event()  # SIGTERM or SIGINT came: forward, restart nothing
        self.stopped_by = signal.SIGTERM
        self.progress: tuple[int, float] | None = None  # the trainer's newest (step, time)
        self.started_at = 0.0
        self.since = (
            protocol.kernel_start()
        )  # this supervisor's start: its trainers' records say it
        self.spawned_at = self.since  # when the newest trainer was started

    def run(self) -> int:
        restarts = 0
        death: Death | None = None
        with self._forwarding_signals():
            while True:
                told = death  # the death this trainer is told of, for its record
                ending = self._run_child(restarts, death)
                if ending.finished:
                    return 0
                died = time.time()
                mine = self._records_of(restarts)
                at, newest = self._where_it_stopped(mine)
                latest = names.checkpoint_name(newest) if newest else "none (nothing saved)"
                if self.stop.is_set() and ending.returncode >= 0:
                    return ending.exit_code  # it ended by itself (75: saved at the forwarded stop)
                if not ending.restartable(asked_to_stop=False) and not self.stop.is_set():
                    return ending.exit_code  # its own error line says why
                self._record_if_unrecorded(mine, restarts, told, died, ending)
                if self.stop.is_set():
                    return self._stopped(f"{ending.what()}{at}", latest)
                death = Death(t=died, cause=ending.what().removeprefix("the trainer "))
                if self.progress is not None:  # its last step, and when it got there
                    death.step, death.step_t = self.progress
                if restarts >= self.max_restarts:
                    say(
                        f"tpurun train: error: {ending.what()}{at}; no restart left "
                        f"(--max_restarts={self.max_restarts}, all spent); the latest "
                        f"checkpoint is {latest}: rerun the same command to resume from it"
                    )
                    return ending.exit_code
                restarts += 1
                resume = f"resuming from {latest}" if newest else "starting from scratch"
                say(f"restart {restarts}/{self.max_restarts}: {ending.what()}{at}; {resume}")
                if not self._wait_before(restarts):
                    if self.stop.is_set():
                        return self._stopped(f"{ending.what()}{at}", latest)
                    say(
                        f"tpurun train: error: gave up waiting for the TPU {self.run_config.tpu!r} "
                        f"to be READY again after {tpu_wait.WAIT_SECONDS:.0f}s ({ending.what()})"
                    )
                    return ending.exit_code

    def _stopped(self, what: str, latest: str) -> int:
        """A signal stopped tpurun while no trainer ran, or one that then died otherwise (it
        could not save at the signal): the line, and the exit a trainer's own stop gives."""
        name = signal.Signals(self.stopped_by).name
        code = STOPPED_EXIT.get(self.stopped_by, EXIT_PREEMPTED)
        say(
            f"tpurun train: error: {name}: stopped without restarting the trainer ({what}), "
            f"which left nothing to save; the latest checkpoint is {latest}: rerun the same "
            f"command to resume from it (exit {code})"
        )
        return code

    def _record_if_unrecorded(
        self,
        found: list[TimeAccount],
        restart: int,
        told: Death | None,
        died: float,
        ending: Ending,
    ) -> None:
        """The run record of the trainer that just died (`found`: its record if it wrote one),
        when it wrote none: a death tpurun counts (a signal, a failure that passes)."""
        if found or not ending.restartable(asked_to_stop=False):
            return  # its own record; or it failed by itself, early: it made nothing
        account = TimeAccount(
            process_start=self.spawned_at,
            spawned_at=self.spawned_at,
            supervisor_start=self.since,
            restart=restart,
            updated=max(died, self.spawned_at),  # it was starting up until it died
            previous_death=told,
        )
        post_mortem.write(self.run_config.model_dir, account, ending.what())

    def _run_child(self, restart: int, death: Death | None) -> Ending:
        env = {
            **os.environ,
            SUPERVISED_ENV: f"{restart}/{self.max_restarts}",
            SUPERVISOR_START_ENV: repr(self.since),
        }
        # The first trainer's start is this process's: the job's wall time begins here.
        self.spawned_at = self.since if restart == 0 else time.time()
        env[SPAWNED_AT_ENV] = repr(self.spawned_at)
        env.pop(PREVIOUS_DEATH_ENV, None)
        if death:
            env[PREVIOUS_DEATH_ENV] = json.dumps(time_account.as_json(death))
        self.started_at = time.time()
        self.progress = None
        read, write = os.pipe()
        env[PROGRESS_FD_ENV] = str(write)
        try:
            self.child = subprocess.Popen(
                self.command,
                env=env,
                # Its own process group: a Ctrl-C on the terminal reaches this process only,
                # which forwards it once, as SIGTERM (a save, exit 75).
                start_new_session=True,
                preexec_fn=_die_with_parent,
                pass_fds=(write,),
            )
        finally:
            os.close(write)
        listener = threading.Thread(target=self._listen, args=(read,), daemon=True)
        listener.start()
        say(
            f"tpurun train: trainer started (pid {self.child.pid}, attempt {restart + 1} of at "
            f"most {self.max_restarts + 1})"
        )
        if self.stop.is_set():  # a signal came while it was being started
            self._forward(signal.SIGTERM)
        ending = Ending(self.child.wait())
        listener.join(timeout=10)  # the pipe's end: everything the trainer said is read
        return ending

    def _listen(self, fd: int) -> None:
        """Keeps the trainer's newest (step, time) from its progress pipe, until it closes."""
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                with contextlib.suppress(ValueError):
                    step, at = line.split()
                    self.progress = (int(step), float(at))

    def _forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)

    @contextlib.contextmanager
    def _forwarding_signals(self) -> Iterator[None]:
        def handler(signum: int, frame: object) -> None:
            if not self.stop.is_set():
                self.stopped_by = signal.Signals(signum)
            self.stop.set()
            self._forward(signal.SIGTERM)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _records_of(self, restart: int) -> list[TimeAccount]:
        """The time account of this supervisor's trainer `restart`, if it wrote its record."""
        try:
            found = run_records.time_accounts(self.run_config.model_dir).found
        except Exception:  # noqa: BLE001 - an unreadable model_dir: none
            return []
        return [g for _, g in found if g.supervisor_start == self.since and g.restart == restart]

    def _where_it_stopped(self, mine: list[TimeAccount]) -> tuple[str, int | None]:
        """(' at about step 4,310', 4000): the step the trainer last recorded (`mine`: its
        record) or told, and the newest checkpoint on disk (the one the next trainer resumes
        from, as `tpurun.storage.checkpoints` picks it), from the model_dir."""
        last = mine[-1].last if mine else None
        step = last.step if last else None
        if self.progress is not None:  # from the pipe: newer than the record
            step = self.progress[0]
        newest = run_records.newest_checkpoint_step(self.run_config.model_dir)
        return (f" at about step {step:,}" if step is not None else " before its first step"), (
            newest or None
        )

    def _wait_before(self, restart: int) -> bool:
        """The backoff before restart `restart`, then with --tpu=NAME until the node is usable;
        False when a signal came or the node did not come back."""
        delay = min(MAX_BACKOFF, BACKOFF * 2 ** (restart - 1))
        if cluster_size() > 1:
            delay = max(delay, MULTI_WORKER_SETTLE)
        if self.stop.wait(delay):
            return False
        run = self.run_config
        if not tpu_wait.is_named_node(run.tpu):
            return True
        polls = tpu_wait.wait_until_usable(
            tpu_wait.client(run.tpu or "", run.tpu_zone, run.gcp_project),
            stopped=self.stop.is_set,
            sleep=self.stop.wait,
        )
        if polls is None:
            return False
        say(f"tpurun train: the TPU {run.tpu!r} is READY (after {polls} look(s) at it)")
        return True


def cluster_size() -> int:
    """The tasks TF_CONFIG's cluster lists (1 without one)."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
        return max(1, sum(len(tasks) for kind, tasks in cluster.items() if kind != "evaluator"))
    except (ValueError, AttributeError, TypeError):
        return 1


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """In the child: SIGTERM when this supervisor dies (even by SIGKILL), so no trainer is
    left running alone (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
