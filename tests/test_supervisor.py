"""train --max_restarts: which endings restart, the wait for a TPU node, and the supervisor
through the CLI (its trainer children killed for real; no process left behind)."""

from __future__ import annotations

import datetime
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import forked
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, RUN_FAILURE, assert_fails, tensorboard_scalars, tpurun_in_process
from test_resume import assert_bit_identical
from test_tpu import PROJECT, ZONE, FakeCloudTpuApi

from tpurun import report
from tpurun.layout import names as layout_names
from tpurun.layout.plain_files import GcsObjects
from tpurun.supervisor import tpu_wait
from tpurun.supervisor.exits import Ending
from tpurun.supervisor.restarts import child_argv

# --- Unit tests ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returncode", "restarts", "what"),
    [
        (-9, True, "the trainer was killed by SIGKILL"),
        (-11, True, "the trainer was killed by SIGSEGV"),
        (69, True, "the trainer lost a TPU worker or cluster peer"),
        (3, True, "the trainer made no progress for --hang_timeout"),
        (75, True, "the trainer was preempted"),
        (0, False, "the trainer exited 0"),
        (1, False, "the trainer exited 1"),  # a run failure: a NaN, bad data
        (2, False, "the trainer exited 2"),  # usage or config
        (130, False, "the trainer exited 130"),
    ],
)
def test_which_endings_restart(returncode, restarts, what):
    ending = Ending(returncode)
    assert ending.restartable(asked_to_stop=False) is restarts
    assert not ending.restartable(asked_to_stop=True)  # a stop tpurun forwarded: never
    assert ending.what().startswith(what)
    assert ending.exit_code == (128 - returncode if returncode < 0 else returncode)


def test_the_child_gets_the_same_flags_without_max_restarts():
    argv = ["tpurun", "train", "--config=iris", "--max_restarts=2", "--max_restarts", "3", "-x"]
    assert child_argv(argv) == [sys.executable, "-m", "tpurun", "train", "--config=iris", "-x"]


def test_a_multi_worker_cluster_is_counted_from_tf_config(monkeypatch):
    from tpurun.supervisor.restarts import cluster_size

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster_size() == 1
    workers = {"chief": ["a:1"], "worker": ["b:1", "c:1"], "evaluator": ["d:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": workers}))
    assert cluster_size() == 3


@pytest.fixture
def fake_api(monkeypatch):
    api = FakeCloudTpuApi()
    monkeypatch.setenv("TPU_API_DISCOVERY_URL", api.discovery_url)
    monkeypatch.setenv("TPURUN_TPU_ANONYMOUS_CREDENTIALS", "1")
    yield api
    api.close()


def node_gets(api: FakeCloudTpuApi) -> int:
    return sum(1 for path in api.requests if path.startswith("/v1/projects/"))


def test_the_wait_polls_a_preempted_node_until_it_is_ready(fake_api):
    fake_api.add_node("spot", state="PREEMPTED", health="HEALTH_UNSPECIFIED")
    full_name = next(iter(fake_api.nodes))
    said: list[str] = []

    def sleep(seconds: float) -> None:
        if node_gets(fake_api) >= 6:  # the third look sees it READY
            fake_api.nodes[full_name].update(state="READY", health="HEALTHY")

    polls = tpu_wait.wait_until_usable(
        tpu_wait.client("spot", ZONE, PROJECT), say=said.append, poll_seconds=0, sleep=sleep
    )
    assert polls == 4 and node_gets(fake_api) == 2 * polls  # state and health per look
    assert said == [
        "tpurun train: waiting for the TPU 'spot' to be READY and HEALTHY: it is PREEMPTED, "
        "HEALTH_UNSPECIFIED (it cannot come back by itself: waiting for it to be created "
        "again under its name, by a queued resource or by you)"
    ]


def test_the_wait_gives_up_after_its_time(fake_api):
    fake_api.add_node("gone", state="STOPPED")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    polls = tpu_wait.wait_until_usable(
        tpu_wait.client("gone", ZONE, PROJECT),
        say=lambda line: None,
        poll_seconds=10,
        wait_seconds=35,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert polls is None and now[0] == 30


# --- The supervisor in this process, its trainers stubs (tests/stub_trainer.py) ------------

STUB = Path(__file__).with_name("stub_trainer.py")


def supervise_stubs(
    model_dir: Path, plan: list[dict], max_restarts: int, monkeypatch, on_line=None, backoff=0.001
):
    """Runs the real Supervisor over stub trainers that follow `plan` (one entry per attempt);
    returns (its exit code, the lines it said). `on_line(line)` sees each line as it is said;
    `backoff`: the seconds before a first restart."""
    from iris_runs import iris_run

    from tpurun.supervisor import restarts as supervisor

    (model_dir.parent / "plan.json").write_text(json.dumps(plan))
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if on_line is not None:
            on_line(line)

    monkeypatch.setattr(supervisor, "say", say)
    monkeypatch.setattr(supervisor, "BACKOFF", backoff)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    command = [sys.executable, str(STUB), str(model_dir.parent / "plan.json"), str(model_dir)]
    code = supervisor.Supervisor(command, iris_run(model_dir), max_restarts).run()
    return code, said


def test_after_n_kills_the_report_counts_n_restarts_and_disruptions(tmp_path, monkeypatch):
    """Four trainers killed, two before they wrote their record (the first before the
    model_dir existed), the fifth finishes; each restart line names the newest checkpoint
    on disk, which the trainer's record had not yet listed."""
    model_dir = tmp_path / "model"
    plan = [
        {"end": "kill"},  # in TensorFlow's import: no model_dir yet
        {"record": True, "checkpoints": [10, 20], "end": "kill"},
        {"end": "kill"},  # killed before its record, into an existing runs/
        {"record": True, "checkpoints": [30], "end": "kill"},
        {"record": True, "end": "finish"},
    ]
    code, said = supervise_stubs(model_dir, plan, 4, monkeypatch)
    assert code == 0, said
    restarts = [line for line in said if line.startswith("restart ")]
    assert [r.rsplit("; ", 1)[1] for r in restarts] == [
        "starting from scratch",
        "resuming from ckpt-20",
        "resuming from ckpt-20",
        "resuming from ckpt-30",
    ]
    summary = report.read(str(model_dir))
    assert (summary.restarts, summary.disruptions, summary.processes) == (4, 4, 4)
    # The third trainer's record, written by its supervisor: its start and its death.
    (written,) = [
        json.loads(p.read_text())["goodput"]
        for p in (model_dir / "runs").iterdir()
        if "unrecorded" in p.read_text()
    ]
    assert written["restart"] == 2 and "killed by SIGKILL" in written["unrecorded"]
    assert written["previous_death"]["cause"] == "was killed by SIGKILL"
    assert not [p for p in (model_dir / "runs").iterdir() if "tpurun-tmp" in p.name]


def test_when_the_restarts_are_spent_the_line_names_the_newest_checkpoint_on_disk(
    tmp_path, monkeypatch
):
    """The second trainer saved ckpt-30 and died before its record or state file said so;
    hostile records in runs/ break neither the supervisor nor the account."""
    model_dir = tmp_path / "model"
    runs = model_dir / "runs"
    runs.mkdir(parents=True)
    (runs / "20261126T000000.000000Z-train.json").write_text('{"goodput": [1, 2]}')
    (runs / "20261126T000001.000000Z-train.json").mkdir()
    plan = [
        {"record": True, "checkpoints": [10, 20], "end": "kill"},
        {"checkpoints": [30], "end": "kill"},
    ]
    code, said = supervise_stubs(model_dir, plan, 1, monkeypatch)
    assert code == 128 + signal.SIGKILL
    assert said[-1] == (
        "tpurun train: error: the trainer was killed by SIGKILL at about step 30; no restart "
        "left (--max_restarts=1, all spent); the latest checkpoint is ckpt-30: rerun the same "
        "command to resume from it"
    )
    summary = report.read(str(model_dir))
    assert (summary.restarts, summary.disruptions, summary.processes) == (1, 2, 2)


def test_a_sigterm_during_the_backoff_ends_with_one_line_and_exit_75(tmp_path, monkeypatch):
    """SIGTERM to tpurun while it waits to restart a dead trainer: no trainer to forward it
    to, nothing to save; exit 75 (not the dead trainer's 137) and the line saying so."""

    def on_line(line: str) -> None:
        if line.startswith("restart 1/"):  # said just before the backoff begins
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()

    plan = [{"record": True, "checkpoints": [10], "end": "kill"}, {"end": "finish"}]
    # A backoff of an hour: only the signal ends it.
    code, said = supervise_stubs(tmp_path / "model", plan, 2, monkeypatch, on_line, backoff=3600)
    assert code == 75, said
    assert said[-1] == (
        "tpurun train: error: SIGTERM: stopped without restarting the trainer (the trainer "
        "was killed by SIGKILL at about step 10), which left nothing to save; the latest "
        "checkpoint is ckpt-10: rerun the same command to resume from it (exit 75)"
    )
    assert sum("trainer started" in line for line in said) == 1  # nothing restarted
    assert signal.getsignal(signal.SIGTERM) is not None  # its handler put back as it was


def test_a_usage_error_of_the_trainer_is_not_retried(tmp_path, monkeypatch):
    """A trainer's usage error (exit 2, such as a --split the model lacks, found once it
    built the model: tests/test_eval_splits.py) ends the supervisor at once with its code;
    the trainer's own error line is the only one (the supervisor adds none)."""
    plan = [{"end": "exit:2"}, {"end": "finish"}]
    code, said = supervise_stubs(tmp_path / "model", plan, 2, monkeypatch)
    assert code == 2, said
    assert sum("trainer started" in line for line in said) == 1, said
    assert not [line for line in said if line.startswith("restart ") or ": error: " in line], said


# --- Through the CLI: the supervisor and its trainers as processes ---------------------

pytestmark_slow = pytest.mark.slow
STARTED = re.compile(r"trainer started \(pid (\d+)")


# `python -m tpurun` with the supervisor's first backoff (tpurun.supervisor.restarts.BACKOFF, 1 s:
# BACKOFF * 2^(k-1) before restart k) set to argv[1] seconds: the restarts below are
# about what ends and resumes, not about how long the supervisor waits (the backoff a
# SIGTERM interrupts: test_a_sigterm_during_the_backoff_ends_with_one_line_and_exit_75).
SHORT_BACKOFF = """
import sys
import tpurun.supervisor.restarts
tpurun.supervisor.restarts.BACKOFF = float(sys.argv.pop(1))
sys.argv[0] = "tpurun"
from tpurun.__main__ import main

main()
"""


FORKING = Path(__file__).with_name("forking_supervisor.py")


class Supervised:
    """`tpurun train --max_restarts=...` in a process of its own (restarting after a
    first backoff of 0.05 s); its stderr (and its trainers', which share it) read as it
    comes. `forks`: the supervisor is a `forked.Popen` whose trainers are forks of it
    (tests/forking_supervisor.py: no ~5 CPU-s TensorFlow import per trainer), not fresh
    `python -m tpurun` interpreters; for a test whose trainers get past that import."""

    def __init__(self, *args: str, env: dict | None = None, forks: bool = False):
        if forks:  # the forking server up first (its start-up is not this run's time)
            forked.run([sys.executable, "-c", "pass"], check=True)
        self.began = time.monotonic()
        command = [sys.executable, "-c", SHORT_BACKOFF]
        if forks:
            command = [sys.executable, str(FORKING)]
        self.process = (forked.Popen if forks else subprocess.Popen)(
            [*command, "0.05", "train", *args],
            env={**os.environ, **OFFLINE_ENV, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # the end
            self._changed.notify_all()

    def wait_for(self, pattern: str, start: int = 0, timeout: float = 300) -> tuple[int, re.Match]:
        """The first line from `start` on matching `pattern`: its index and match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for i in range(start, len(self.lines)):
                    found = regex.search(self.lines[i])
                    if found:
                        return i, found
                    if self.lines[i] == "":
                        raise AssertionError(f"ended without {pattern!r}:\n{self.log[-4000:]}")
                start = len(self.lines)
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no {pattern!r} in time:\n{self.log[-4000:]}"
                self._changed.wait(remaining)

    def trainer(self, start: int = 0) -> tuple[int, int]:
        """The index of the next `trainer started` line and the pid it names."""
        i, found = self.wait_for(STARTED.pattern, start)
        return i, int(found.group(1))

    def finish(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout=timeout)
        self.seconds = time.monotonic() - self.began
        self._reader.join(timeout=60)
        return code

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def pids(self) -> list[int]:
        return [int(p) for p in STARTED.findall(self.log)]


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def assert_nothing_left(run: Supervised) -> None:
    alive = [pid for pid in [run.process.pid, *run.pids()] if running(pid)]
    assert not alive, f"processes left running: {alive}"


# The flops model at a size whose steps take milliseconds on a CPU (a lost step is
# measurable), saving every 50 steps in loops of 5, 200 steps (the one trainer killed dies
# at step 125-135, the next resumes from 100 and trains 100 more: the kill lands before
# the next save, and far from the run's end, however late). Its host loop is forced:
# with config.train.xla="auto" each fresh run times both loops, and the reference and the
# supervised run could choose differently under load (the two loops round sums
# differently: CI once saw the last bits differ). The plain loop: XLA's compile (seconds
# in each of the three runs) is not the subject; the kill, the restart and the account are.
FLOPS = (
    "--config=flops",
    "--use_tpu=false",
    "--config.train.xla=false",
    "--config.flops.n=256",
    "--config.flops.matmuls=8",
    "--batch_size=256",
    "--iterations=5",
    "--save_checkpoints_steps=50",
    "--train_steps=200",
)
LOOP = re.compile(r"\] step (\d+)/200 .*? ([\d.]+) steps/sec")
SAVED = re.compile(r"Saved checkpoint \S+/ckpt-(\d+)\.")
RESUMED = re.compile(r"Resuming from \S+ \(step (\d+)\)")
RESTART = re.compile(r"^restart \d", re.MULTILINE)


@pytest.fixture(scope="module")
def flops_reference(tmp_path_factory) -> Path:
    model_dir = tmp_path_factory.mktemp("flops-reference")
    result = tpurun_in_process("train", *FLOPS, f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir / "ckpt-200"


# How early a process's start may read in tpurun (tpurun.supervisor.protocol.kernel_start):
# /proc's resolution, the uptime's hundredths of a second and a clock tick, with room.
START_READ_EARLY_S = 0.05


def logged_at(line: str) -> float:
    """The time (epoch seconds) of an absl log line: `I1126 11:50:26.402502 ...`."""
    stamp = datetime.datetime.strptime(
        f"{datetime.date.today().year}{line[1:5]} {line[6:21]}", "%Y%m%d %H:%M:%S.%f"
    )
    return stamp.timestamp()


@pytest.mark.slow
def test_a_sigkill_is_restarted_and_ends_bit_identical_and_the_report_counts_it(
    tmp_path, flops_reference
):
    """The trainer is SIGKILLed at a random host loop 25-35 steps past its newest saved
    checkpoint, after its second save; the next resumes and finishes. (At least 3 loops
    before its next save: it trains on until the kill lands, and on a loaded machine the
    test reads its loop line late.) (One kill: a second one, of a resumed trainer, takes the
    same path again; the count of several restarts and disruptions is
    test_after_n_kills_the_report_counts_n_restarts_and_disruptions's.)"""
    rng = random.Random(30)
    run = Supervised(
        *FLOPS,
        f"--model_dir={tmp_path}",
        "--max_restarts=2",
        env={"TPURUN_COUNT_FLOPS": "1"},
        forks=True,
    )
    start, pid = run.trainer()
    gap = rng.randint(25, 35)
    saved: list[int] = []
    while True:
        start, found = run.wait_for(f"{LOOP.pattern}|{SAVED.pattern}", start + 1)
        if found.group(3):
            saved.append(int(found.group(3)))
        elif len(saved) >= 2 and int(found.group(1)) - saved[-1] >= gap:
            break
    os.kill(pid, signal.SIGKILL)
    # The step of the loop line, when it was logged, and when the kill came (the trainer
    # went on training meanwhile), and the log lines of this trainer.
    kills = [(int(found.group(1)), logged_at(run.lines[start]), time.time(), start)]
    assert run.finish() == 0, run.log[-4000:]
    assert_nothing_left(run)
    log = run.log
    restarts = re.findall(
        r"^restart (\d)/2: the trainer was killed by SIGKILL at about step "
        r"([\d,]+); resuming from ckpt-(\d+)$",
        log,
        re.MULTILINE,
    )
    assert [r[0] for r in restarts] == ["1"], log[-4000:]
    resumed = [int(s) for s in RESUMED.findall(log)]
    assert [int(r[2]) for r in restarts] == resumed  # the line names the checkpoint used
    assert_bit_identical(tmp_path / "ckpt-200", flops_reference)

    summary = report.read(str(tmp_path))
    assert (summary.disruptions, summary.restarts, summary.steps) == (1, 1, 200)
    # The time the retrained steps took, by the trainers' own log: from the loop line of the
    # checkpoint the next trainer resumed from to the kill.
    lost = 0.0
    for (_, _, killed, at), resumed_from in zip(kills, resumed, strict=True):
        (saved_at,) = [
            logged_at(line)
            for line in run.lines[:at]
            if (loop := LOOP.search(line)) and int(loop.group(1)) == resumed_from
        ][-1:]
        lost += killed - saved_at
    assert summary.badput_s["lost_progress"] == pytest.approx(lost, rel=0.25), (
        kills,
        resumed,
        summary,
    )
    accounted = summary.goodput_s + sum(summary.badput_s.values())
    assert accounted == pytest.approx(summary.wall_s)
    # The account begins at the supervisor's start and ends with the last trainer's record:
    # its exit after it and the supervisor's are not in it. (The supervisor's start as
    # tpurun reads it, from /proc, may be early by START_READ_EARLY_S.)
    assert run.seconds * 0.85 <= accounted <= run.seconds + START_READ_EARLY_S, (
        accounted,
        run.seconds,
    )
    assert summary.model_flops_per_step == pytest.approx((6 * 8 - 2) * 256 * 256**2, rel=0.02)
    assert summary.mfu is None and summary.achieved_flops_per_s
    assert "tpurun train: goodput " in log and "MFU n/a" in log
    scalars = tensorboard_scalars(tmp_path)
    assert scalars["goodput/lost_progress_s"] == [
        (200, pytest.approx(summary.badput_s["lost_progress"], rel=1e-3))
    ]
    assert "mfu" not in scalars  # a CPU: no peak, no MFU


@pytest.mark.slow
def test_with_a_named_tpu_a_restart_waits_for_ready_and_a_third_death_ends_it(tmp_path, fake_api):
    """Each trainer is killed as soon as it starts (before it imports TensorFlow): the
    first while its node is PREEMPTED, so the restart polls until the test makes it READY."""
    fake_api.add_node("spot")
    full_name = next(iter(fake_api.nodes))
    run = Supervised(
        "--config=iris",
        "--tpu=spot",
        f"--tpu_zone={ZONE}",
        f"--gcp_project={PROJECT}",
        f"--model_dir={tmp_path}",
        "--max_restarts=2",
        env={
            "TPURUN_TPU_POLL_SECONDS": "0.2",
            "TPU_API_DISCOVERY_URL": fake_api.discovery_url,
            "TPURUN_TPU_ANONYMOUS_CREDENTIALS": "1",
        },
    )
    start, pid = run.trainer()
    fake_api.nodes[full_name]["state"] = "PREEMPTED"
    os.kill(pid, signal.SIGKILL)
    start, _ = run.wait_for(
        r"^restart 1/2: the trainer was killed by SIGKILL before its "
        r"first step; starting from scratch$",
        start,
    )
    start, _ = run.wait_for(
        "waiting for the TPU 'spot' to be READY and HEALTHY: it is PREEMPTED", start
    )
    deadline = time.monotonic() + 120
    while node_gets(fake_api) < 6:  # three looks at it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fake_api.nodes[full_name]["state"] = "READY"
    start, ready = run.wait_for(r"the TPU 'spot' is READY \(after (\d+) look", start)
    assert int(ready.group(1)) >= 3 and node_gets(fake_api) == 2 * int(ready.group(1))
    for restart in (2, 3):
        start, pid = run.trainer(start)
        os.kill(pid, signal.SIGKILL)
        if restart == 2:
            start, _ = run.wait_for(r"^restart 2/2: the trainer was killed by SIGKILL", start)
    assert run.finish() == 128 + signal.SIGKILL
    (line,) = [x for x in run.lines if ": error: " in x]
    assert line == (
        "tpurun train: error: the trainer was killed by SIGKILL before its "
        "first step; no restart left (--max_restarts=2, all spent); the latest checkpoint is "
        "none (nothing saved): rerun the same command to resume from it\n"
    )
    assert len(run.pids()) == 3
    assert_nothing_left(run)


@pytest.mark.slow
def test_sigterm_to_tpurun_is_one_save_exit_75_and_no_restart(bucket, gcs, tpurun_cli):
    """On gs://, where real runs keep their model_dir. While the trainer trains, a second
    trainer (in this process) is refused at once by its lease; then tpurun gets SIGTERM and
    forwards it: the trainer saves at the step it reached, says so in one line, releases its
    lease on the way out, and the run that resumes loses no step. (Also the moment "in the
    training loop" of tests/test_durability.py's SIGTERM at every moment, and the first
    trainer of tests/test_gcs_lease.py.)"""
    model_dir = f"{bucket}/iris"
    # The plain host loop: with "auto" a run this long compiles and times XLA's loop too
    # before its first loop line (and the resumed run compiles the loop it recorded); which
    # loop runs is not the subject, the SIGTERM's save is.
    run = Supervised(
        "--config=iris",
        "--use_tpu=false",
        "--config.train.xla=false",
        "--train_steps=100000000",
        "--save_checkpoints_steps=100000000",
        "--save_checkpoints_secs=1000000",
        f"--model_dir={model_dir}",
        "--max_restarts=2",
        env=gcs.env,
        forks=True,
    )
    _, pid = run.trainer()
    run.wait_for(r"\] step \d+/100000000 ")
    second = tpurun_cli("train", "--config=iris", "--use_tpu=false", f"--model_dir={model_dir}")
    line = assert_fails(
        second, RUN_FAILURE, "is being trained by another tpurun train", f"pid {pid}"
    )
    assert "--force_takeover" in line and "since " in line
    # At once: while the first trains (100,000,000 steps), not once it is done.
    assert run.process.poll() is None, run.log[-4000:]
    run.process.send_signal(signal.SIGTERM)
    assert run.finish() == 75, run.log[-4000:]
    log = run.log
    assert len(SAVED.findall(log)) == 1
    assert not RESTART.search(log) and len(run.pids()) == 1
    assert_nothing_left(run)
    assert "Traceback" not in log, log[-3000:]
    (line,) = [x for x in run.lines if ": error: " in x]
    assert "SIGTERM" in line and "rerun the same command" in line, line
    # A fresh process finds the bucket from the environment alone (TensorFlow's client and
    # the lease's gcsfs): no request refused (another host than the storage API's) or for a token.
    assert not [r for r in gcs.requests if r.kind in ("refused", "auth")], gcs.requests
    # Saved at the step it had reached (loops of 100), which the next run resumes from.
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+)", log).group(1))
    logged = [int(s) for s in re.findall(r"step (\d+)/100000000", log)]
    assert saved == max(logged) > 0 and saved % 100 == 0, log[-3000:]
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-{saved}"
    assert GcsObjects().read(f"{model_dir}/{layout_names.LEASE}") is None, "not released"
    names = [name for _, _, files in tf.io.gfile.walk(model_dir) for name in files]
    assert not [n for n in names if "_temp" in n or "tpurun-tmp" in n], names
    resumed = tpurun_cli(
        "train", "--config=iris", "--use_tpu=false", "--iterations=100",
        f"--train_steps={saved + 200}", f"--model_dir={model_dir}",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {saved})" in resumed.stderr
    assert f"Training from step {saved} to {saved + 200}" in resumed.stderr
