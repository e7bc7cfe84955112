"""tpurun.data_service: training input made by a tf.data service that tpurun starts and watches.

Unit tests first (the keys, the job names and resume plan, the pipeline check, the watch's
deadline, the sizing, the command line), then a dispatcher and two workers as processes of
their own on 127.0.0.1 (`tpurun data-service`, forked: tests/forked), shared by the module
and stopped by SIGTERM at its end: mnist and the CPU-sized ResNet train through them,
distributed_epoch is counted, a pipeline with Python is refused by check and train, a
worker is SIGKILLed mid-run, and a dispatcher of its own is SIGKILLed under --max_restarts.
The trainers that a test kills, or whose watch may end them (os._exit), run in processes
of their own; the rest in-process. The test model (data_service_fixtures/paced_model.py)
trains on ids it can count, paced by TensorFlow's SleepDataset, so a run lasts without
burning CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import forked
import ml_collections
import pytest
from conftest import (
    _SESSION_PROCESSES,
    OFFLINE_ENV,
    USAGE,
    assert_fails,
    assert_ok,
    free_local_ports,
    tpurun_in_process,
)

from tpurun import config_defaults
from tpurun.data_service import job, sizing
from tpurun.errors import UsageError
from tpurun.run_config.keys import service_keys

FIXTURES = Path(__file__).with_name("data_service_fixtures")
PACED = f"--config={FIXTURES / 'paced.py'}"
LOCAL = "--use_tpu=false"
# The runs a test kills a server under, each in a process of its own: the watch looks
# every 2 s, and the run ends after 8 s of silence. In-process runs keep the default
# (120 s): a silence the watch believed under load would end the test's own process.
TIMEOUT = "--config.data.service_timeout=8"


def data(**keys) -> ml_collections.ConfigDict:
    config = config_defaults.base_config(model="iris")
    config.data.update(keys)
    return config


# --- The keys, checked before TensorFlow loads ------------------------------------------


def test_the_service_is_off_unless_named():
    assert service_keys.service(data()) is None
    assert service_keys.service(ml_collections.ConfigDict({"data": {}})) is None
    on = service_keys.service(data(service="grpc://10.0.0.5:5050"))
    assert on == service_keys.Service("10.0.0.5:5050", "distributed_epoch", 120.0)
    assert on.target == "grpc://10.0.0.5:5050"


@pytest.mark.parametrize(
    "keys, words",
    [
        ({"service": "10.0.0.5:5050"}, "is not a dispatcher address: give grpc://HOST:PORT"),
        ({"service": "grpc://host:99999"}, "is not a dispatcher address"),
        ({"service": "grpc://h:5050", "service_processing_mode": "epochs"}, "parallel_epochs"),
        ({"service": "grpc://h:5050", "service_timeout": 0.0}, "must be seconds, above 0"),
    ],
    ids=["no_scheme", "port", "mode", "timeout"],
)
def test_a_bad_key_is_one_line(keys, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        service_keys.service(data(**keys))


def test_train_refuses_a_bad_address_before_anything_runs(tpurun_cli, tmp_path):
    result = tpurun_cli(
        "train", LOCAL, f"--model_dir={tmp_path / 'm'}", "--config.data.service=localhost:5050"
    )
    assert_fails(result, USAGE, "config.data.service='localhost:5050'", "grpc://HOST:PORT")
    assert not (tmp_path / "m").exists()


# --- Job names, and where a resumed run's input restarts ---------------------------------


def test_each_attempt_names_its_own_job():
    names = {job.job_name("gs://b/run", token) for token in (1, 2)}
    assert len(names) == 2
    assert all(re.fullmatch(r"tpurun-[0-9a-f]{8}-[0-9a-f]{12}", name) for name in names)
    assert job.job_name("gs://b/run", 1) != job.job_name("gs://b/other", 1)


def test_a_resumed_input_that_seeks_restarts_at_its_epochs_first_batch():
    # 10,000 examples an epoch, 32 a step (8 per replica): step 1200 is in epoch 4 (index 3),
    # which began at example 30,000, step 937.5; its first whole batch is the 3,750th.
    resume = job.plan(1200, 10_000, 32, 8, seeks=True, model_name="M")
    assert (resume.epoch, resume.epoch_step, resume.start_batch) == (3, 937.5, 3750)
    assert "resumed at step 1200, its input restarts at the start of epoch 4 (step 937.5)" in (
        resume.line(service_keys.Service("h:1", "distributed_epoch", 9.0), "j")
    )
    assert resume.record(service_keys.Service("h:1", "distributed_epoch", 9.0), "j") == {
        "service": "grpc://h:1",
        "processing_mode": "distributed_epoch",
        "job_name": "j",
        "started_at_step": 1200,
        "input_starts_at": {"epoch": 4, "step": 937.5},
        "exact_resume": False,
        "why_not_epoch": None,
    }


@pytest.mark.parametrize("step", [1200, 0], ids=["epoch", "stream_start"])
def test_the_record_field_reads_back_as_written(step):
    """The run record's data_service field, as `tpurun report` reads it back (checked by
    tpurun.layout.served_input, its one schema)."""
    from tpurun.layout import served_input

    field = job.plan(step, 10_000, 32, 8, seeks=True, model_name="M").record(
        service_keys.Service("h:1", "parallel_epochs", 9.0), "j"
    )
    read = served_input.check(json.loads(json.dumps(field)))
    assert served_input.as_json(read) == field
    assert read.input_starts_at == (served_input.InputStart(4, 937.5) if step else None)


@pytest.mark.parametrize(
    "seeks, examples, why",
    [(False, 10_000, "M.input_fn does not start where it is told"), (True, None, "unknown")],
    ids=["no_seek", "no_epoch_size"],
)
def test_otherwise_it_restarts_at_its_streams_start(seeks, examples, why):
    resume = job.plan(1200, examples, 32, 8, seeks=seeks, model_name="M")
    assert (resume.start_batch, resume.epoch) == (0, None)
    assert why in resume.why_not_epoch
    assert job.plan(0, 10_000, 32, 8, True, "M") == job.Resume(0, 0)


# --- The pipeline check ------------------------------------------------------------------


@pytest.mark.parametrize(
    "python, named",
    [
        ("py_function", "tf.py_function"),
        ("numpy_function", "tf.numpy_function"),
        ("from_generator", "Dataset.from_generator"),
        ("", None),
    ],
    ids=["py_function", "numpy_function", "from_generator", "none"],
)
def test_python_is_found_in_the_datasets_graph(python, named):
    sys.path.insert(0, str(FIXTURES))
    try:
        import paced_data  # the data alone: no model registered in this process
    finally:
        sys.path.remove(str(FIXTURES))
    from tpurun.data_service import python_calls

    dataset = paced_data.with_python(paced_data.ids(8), python).batch(4)
    assert python_calls(dataset) == ([named] if named else [])


# --- The watch's deadline ----------------------------------------------------------------


class FakeServers:
    """What answers for a service, as a test sets it: the dispatcher `silent` (why) or not,
    its `listed` workers and whether each answers."""

    def __init__(self):
        self.silent: str | None = None
        self.listed = {"w1:1": True, "w2:1": True}

    def workers(self) -> list[str]:
        from tpurun.data_service.rpc import Unanswered

        if self.silent:
            raise Unanswered(self.silent)
        return list(self.listed)

    def worker_answers(self, address: str) -> bool:
        return self.listed[address]

    def close(self) -> None:
        pass


def watch_of(servers: FakeServers, exits: list[str]):
    """A Watch of a service silent at most 10 s, from step 40; its process ends into `exits`."""
    from tpurun.data_service.watch import Watch

    service = service_keys.Service("d:1", "distributed_epoch", 10.0)
    return Watch(service, "/m", 40, exit_process=exits.append, servers=servers)


def test_a_lost_worker_is_said_and_training_goes_on(caplog):
    servers, exits = FakeServers(), []
    watch = watch_of(servers, exits)
    watch.check(0.0)
    servers.listed["w2:1"] = False
    with caplog.at_level("INFO", logger="absl"):
        watch.check(1.0)
        watch.check(100.0)
    assert (
        "tf.data service worker w2:1 is lost (it does not answer): training goes on with the "
        "1 other(s)." in caplog.text
    )
    assert watch.failure is None and exits == []


def test_a_silent_dispatcher_ends_a_stuck_run_at_the_deadline():
    servers, exits = FakeServers(), []
    watch = watch_of(servers, exits)
    watch.progressed(0.0)  # the loop's last sign of life, before the silence
    watch.check(0.0)
    servers.silent = "connection refused"
    watch.check(1.0)
    watch.check(10.9)
    assert exits == []
    watch.check(11.0)  # silent 10 s, no loop since: the process ends
    assert len(exits) == 1
    assert exits[0].startswith("tpurun train: error: the tf.data service's dispatcher at d:1 ")
    assert "has not answered for 10s" in exits[0]
    assert "ends at its last checkpoint (/m/ckpt-40) with exit 69" in exits[0]


def test_a_run_still_training_ends_at_its_next_loop_with_exit_69():
    from tpurun.data_service.watch import ServiceWatch
    from tpurun.errors import Unavailable

    servers, exits = FakeServers(), []
    watch = watch_of(servers, exits)
    servers.listed = {"w1:1": False, "w2:1": False}
    watch.check(0.0)
    watch.progressed(5.0)  # the loop moves on, with the batches it had
    watch.check(10.0)
    assert exits == [] and "workers have all been silent for 10s" in watch.failure

    class Served:  # what the trainer's ServiceInput gives the action
        def __init__(self):
            self.watch = watch

        def line(self) -> str:
            return "the start line"

        def record(self) -> dict:
            return {}

    action = ServiceWatch(lambda: Served())
    with pytest.raises(Unavailable, match="workers have all been silent"):
        action.start(40, 100)
    watch.check(20.0)  # had no loop come within another timeout: the process ends
    assert len(exits) == 1


@pytest.mark.parametrize(
    "message, lost",
    [
        (
            "Failed to get tasks: Unknown iteration client id 3000. The dispatcher is not "
            "configured to be fault tolerant, so this could be caused by a dispatcher restart.",
            True,
        ),
        ("Failed to get element from worker 10.0.0.7:5051: Task 4 not found", True),
        ("Input to reshape is a tensor with 3 values", False),
    ],
    ids=["job_forgotten", "task_gone", "not_the_service"],
)
def test_a_job_the_service_lost_is_exit_69(message, lost):
    import tensorflow as tf

    from tpurun.data_service import input_errors
    from tpurun.errors import Unavailable

    service = service_keys.Service("d:1", "distributed_epoch", 10.0)
    error = tf.errors.NotFoundError(None, None, message)
    with pytest.raises(Unavailable if lost else tf.errors.NotFoundError) as raised:
        with input_errors(service):
            raise error
    if lost:
        assert "the tf.data service at grpc://d:1 lost this run's input" in str(raised.value)
        assert "with exit 69" in str(raised.value)
    with pytest.raises(tf.errors.NotFoundError), input_errors(None):
        raise error  # no service: TensorFlow's error, as it was


# --- check --target's sizing -------------------------------------------------------------


def test_sizing_counts_workers_and_prints_their_commands():
    from tpurun.check.bounds.host_input import rate

    # 1,000 examples per CPU-second: a 32-vCPU worker makes 25.6k/s after the service's
    # share; 16 hosts taking 10k/s each need 160k/s: 7 workers.
    found = sizing.Sizing.of(1000.0, 10_000.0, 16)
    assert (found.workers, found.per_worker, found.needed) == (7, 25_600.0, 160_000.0)
    lines = sizing.lines(found, "resnet50", [], rate)
    assert lines[0].startswith("  tf.data service: 7 workers of 32 vCPUs (n2-standard-32")
    assert any("tpurun data-service dispatcher --port=5050 --work_dir=gs://" in ln for ln in lines)
    assert any("seq 1 7" in ln and "tpurun data-service worker --dispatcher=" in ln for ln in lines)
    assert lines[-1].strip().startswith("then train with --config=resnet50 --config.data.service=")
    refused = sizing.lines(found, "resnet50", ["tf.py_function"], rate)
    assert refused == [
        "  tf.data service: cannot make this input: input_fn(train) calls tf.py_function, "
        "Python that the service's workers cannot run"
    ]


# --- The servers' command line -----------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["data-service"], "needs a role first, dispatcher or worker"),
        (["data-service", "worker", "--port=5051"], "needs --dispatcher=HOST:PORT"),
        (
            ["data-service", "worker", "--dispatcher=h:1", "--work_dir=/w"],
            "(a flag of the dispatcher)",
        ),
        (["data-service", "dispatcher", "--port=70000"], "--port"),
        (["data-service", "dispatcher", "--model_dir=/m"], "--model_dir does not apply to"),
    ],
    ids=["no_role", "no_dispatcher", "other_role", "port", "not_a_run"],
)
def test_the_servers_command_line_is_checked(tpurun_cli, args, words):
    assert_fails(tpurun_cli(*args), USAGE, words)


# --- A dispatcher and two workers, processes of their own --------------------------------


class Server:
    """`tpurun data-service ARGS...` forked (tests/forked); its stdout lines read as they come."""

    def __init__(self, *args: str):
        self.process = forked.Popen(
            [sys.executable, "-m", "tpurun", "data-service", *args],
            env={**os.environ, **OFFLINE_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        _SESSION_PROCESSES.add(self.process.pid)  # the module's: no test's leftover
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120, start: int = 0) -> str:
        """The first line from line `start` on that `pattern` (a regex) is found in."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [line for line in self.lines[start:] if re.search(pattern, line)]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                assert left > 0 and self.process.poll() is None, (pattern, self.lines)
                self._changed.wait(min(left, 1.0))

    def end(self, sig: int | None) -> int:
        """Signals the server (None: signalled already), waits for it; its exit code (gone:
        its pid no longer exists)."""
        if sig is not None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=60)
        _SESSION_PROCESSES.discard(self.process.pid)
        assert not Path(f"/proc/{self.process.pid}").exists() or _zombie(self.process.pid)
        return code


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def worker(dispatcher_port: int, port: int) -> Server:
    return Server(
        "worker",
        f"--dispatcher=127.0.0.1:{dispatcher_port}",
        f"--port={port}",
        "--worker_address=127.0.0.1",
    )


@pytest.fixture(scope="module")
def service():
    """A dispatcher and two workers for the module; whatever a test left running, killed."""
    port, *ports = free_local_ports(3)
    dispatcher = Server("dispatcher", f"--port={port}")
    workers = [worker(port, p) for p in ports]
    started = [dispatcher, *workers]
    try:
        for each in workers:
            each.wait_for("registered with the dispatcher")
        dispatcher.wait_for(r"joined \(2 serving\)")
        yield {"target": f"grpc://127.0.0.1:{port}", "port": port, "servers": started}
    finally:
        for each in started:
            if each.process.poll() is None:
                each.end(signal.SIGKILL)


def through(service, timeout: str = "") -> tuple[str, ...]:
    """The flags of a run through the module's service (`timeout`: TIMEOUT, for a run of a
    process of its own)."""
    return (f"--config.data.service={service['target']}", *filter(None, [timeout]))


def records_resume(model_dir: Path) -> dict:
    """The newest train run record's resume verdict (its time account's `resume`)."""
    newest = sorted((model_dir / "runs").glob("*-train.json"))[-1]
    return json.loads(newest.read_text())["goodput"]["resume"]


@pytest.mark.slow
@pytest.mark.tpu_wheel
def test_mnist_trains_through_the_service_and_says_its_resume(service, tmp_path):
    from synthetic_images import write_digit_records

    digits = write_digit_records(tmp_path / "digits", train=256, test=64)
    common = ("--config=mnist", LOCAL, f"--data_dir={digits}", f"--model_dir={tmp_path / 'm'}")
    small = ("--batch_size=16", "--iterations=5", *through(service))
    first = assert_ok(tpurun_in_process("train", *common, *small, "--train_steps=10"))
    assert "step 10/10" in first.stderr
    assert "Training input through the tf.data service at grpc://127.0.0.1:" in first.stderr
    assert (
        "A resumed run restarts its input at the start of the epoch it resumes in" in first.stderr
    )
    # The kernels' line agrees: deterministic kernels do not make a served resume exact.
    assert "Resumes continue the same run but may differ in the last bits: its input comes " in (
        first.stderr
    )
    assert not records_resume(tmp_path / "m")["bit_identical"]
    resumed = assert_ok(tpurun_in_process("train", *common, *small, "--train_steps=20"))
    said = re.search(
        r"job (tpurun-\S+): resumed at step 10, its input restarts at the start "
        r"of its stream \(Mnist\.input_fn does not start where it is told",
        resumed.stderr,
    )
    assert said, resumed.stderr
    records = [
        json.loads(p.read_text()) for p in sorted((tmp_path / "m" / "runs").glob("*-train.json"))
    ]
    fields = [r["data_service"] for r in records]
    assert [f["started_at_step"] for f in fields] == [0, 10]
    assert fields[1]["job_name"] == said.group(1) != fields[0]["job_name"]
    assert fields[1]["input_starts_at"] == "stream start" and not fields[1]["exact_resume"]
    report = assert_ok(tpurun_in_process("report", f"--model_dir={tmp_path / 'm'}")).stdout
    assert "input          a tf.data service made the input of 2 run(s):" in report
    assert (
        f"job {said.group(1)}, resumed at step 10, input restarted at the start of its stream: "
        "not exact" in report
    )
    # Both workers served: each got a task of the jobs.
    for each in service["servers"][1:]:
        each.wait_for(r"serving [1-9]\d* task")
    # The checkpoints hold no input iterator (a data-service iterator cannot be saved).
    import tensorflow as tf

    saved = [name for name, _ in tf.train.list_variables(str(tmp_path / "m" / "ckpt-20"))]
    assert saved and not [name for name in saved if "iterator" in name.lower()], saved
    # Eval reads here, exact: the service is never asked.
    evaluated = assert_ok(tpurun_in_process("eval", *common, "--batch_size=16"))
    assert "(64 examples)" in evaluated.stdout


@pytest.mark.slow
@pytest.mark.tpu_wheel
def test_the_cpu_sized_resnet_trains_through_the_service(service, tmp_path):
    from synthetic_jpegs import write_imagenet

    images = write_imagenet(tmp_path / "imagenet", train=64, validation=16)
    result = assert_ok(
        tpurun_in_process(
            "train",
            "--config=resnet50:cpu",
            LOCAL,
            f"--data_dir={images}",
            f"--model_dir={tmp_path / 'm'}",
            "--train_steps=4",
            "--iterations=2",
            "--batch_size=16",
            "--config.data.train_examples=64",
            *through(service),
        )
    )
    assert "step 4/4" in result.stderr
    assert "Training input through the tf.data service" in result.stderr


@pytest.mark.slow
@pytest.mark.tpu_wheel
@pytest.mark.parametrize("mode, copies", [("distributed_epoch", 1), ("parallel_epochs", 2)])
def test_distributed_epoch_gives_each_element_once_an_epoch(
    service, tmp_path, monkeypatch, mode, copies
):
    """tpurun's distribute step over the two workers, its batches counted to the end of a
    3-epoch input: distributed_epoch gives each of the 64 ids 3 times, parallel_epochs 3
    times per worker (why tpurun warns of it)."""
    import numpy as np

    from tpurun import cli
    from tpurun import model as model_lib
    from tpurun.cluster import strategy
    from tpurun.data_service import ServiceInput

    # The paced model, registered here for this test only (as a run's own process would):
    # its module and registration gone after it, for the in-process runs that import it.
    monkeypatch.setattr(model_lib.registry, "_REGISTRY", dict(model_lib.registry._REGISTRY))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "paced_model", None)  # not importable until...
    del sys.modules["paced_model"]  # ...the config imports it; undone after the test

    run = cli.parse(
        "train",
        [
            "tpurun",
            PACED,
            LOCAL,
            f"--model_dir={tmp_path}",
            "--config.input_epochs=3",
            f"--config.data.service={service['target']}",
            f"--config.data.service_processing_mode={mode}",
        ],
    )
    model = model_lib.create(run.config)
    served = ServiceInput(run, service_keys.service(run.config), strategy.local(1), model, None, 0)
    try:
        ids = np.concatenate([features.numpy()[:, 0] for features, _ in served.distribute()])
    finally:
        served.watch.stop()
    counts = np.bincount(ids.astype(int), minlength=64)
    assert counts.tolist() == [3 * copies] * 64


@pytest.mark.slow
@pytest.mark.tpu_wheel
@pytest.mark.parametrize("python", ["py_function", "from_generator"])
def test_python_in_the_pipeline_is_refused_by_check_and_train(service, tmp_path, python):
    given = (PACED, f"--config.python={python}", *through(service))
    checked = tpurun_in_process("check", *given, "--num_shards=1")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    named = "tf.py_function" if python == "py_function" else "Dataset.from_generator"
    assert f"Paced.input_fn(train) calls {named} (found in its tf.data graph)" in checked.stdout
    trained = tpurun_in_process("train", *given, LOCAL, f"--model_dir={tmp_path / 'm'}")
    assert_fails(trained, USAGE, f"calls {named}", "drop config.data.service")
    assert not (tmp_path / "m").exists(), "refused before anything was kept"


@pytest.mark.slow
@pytest.mark.tpu_wheel
def test_a_worker_killed_mid_run_and_training_finishes(service, tmp_path):
    """A third worker joins, serves its task, is SIGKILLed: the run says so and finishes."""
    victim = worker(service["port"], free_local_ports(1)[0])
    victim.wait_for("registered with the dispatcher")
    trainer = forked.Popen(
        [
            sys.executable,
            "-m",
            "tpurun",
            "train",
            PACED,
            LOCAL,
            f"--model_dir={tmp_path / 'm'}",
            "--config.pace_ms=100",
            "--train_steps=200",
            *through(service, TIMEOUT),
        ],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A task of the trainer's job (the dispatcher gives it one of every job it still has).
        trainer_started = len(victim.lines)
        victim.wait_for(r"serving \d+ task", start=trainer_started)
        assert victim.end(signal.SIGKILL) == -signal.SIGKILL
        out, err = trainer.communicate(timeout=240)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == 0, err
    assert f"tf.data service worker 127.0.0.1:{victim.process.args[-2].split('=')[1]}" in err
    assert "is lost (it does not answer): training goes on with the 2 other(s)." in err
    assert "step 200/200" in err


@pytest.mark.slow
@pytest.mark.tpu_wheel
def test_a_killed_dispatcher_ends_the_run_with_69_and_max_restarts_resumes_under_a_new_job(
    tmp_path,
):
    """A service of its own: its dispatcher SIGKILLed mid-run ends the trainer with one line
    and exit 69: its deadline passed, or (the dispatcher back, restarted as soon as the
    trainer says it is silent, without a work_dir) its job lost. The supervisor restarts
    it; the resumed run waits for the service (a probe that ran out first is another
    exit 69, before anything starts), says where its input restarts under a job of its
    own, and finishes, fed by the one worker: registered again with the new dispatcher
    (where TensorFlow's workers could be left with stale tasks, tensorflow#52252)."""
    from test_supervisor import Supervised

    port, worker_port = free_local_ports(2)
    dispatcher = Server("dispatcher", f"--port={port}")
    alone = worker(port, worker_port)
    model_dir = tmp_path / "m"
    supervised = None
    try:
        alone.wait_for("registered with the dispatcher")
        supervised = Supervised(
            PACED,
            LOCAL,
            f"--model_dir={model_dir}",
            "--config.pace_ms=40",
            "--train_steps=200",
            "--save_checkpoints_steps=20",
            "--max_restarts=3",
            f"--config.data.service=grpc://127.0.0.1:{port}",
            TIMEOUT,
            forks=True,
        )
        supervised.wait_for(r"Saved checkpoint .*ckpt-20\b")
        assert dispatcher.end(signal.SIGKILL) == -signal.SIGKILL
        supervised.wait_for(r"dispatcher at 127\.0\.0\.1:\d+ does not answer")
        dispatcher = Server("dispatcher", f"--port={port}")
        assert supervised.finish(timeout=240) == 0, supervised.log
    finally:
        if supervised is not None and supervised.process.poll() is None:
            supervised.process.kill()
            supervised.process.wait()
        for each in (dispatcher, alone):
            if each.process.poll() is None:
                each.end(signal.SIGKILL)
    first, *later = [line for line in supervised.lines if ": error: " in line]
    assert "with exit 69" in first and (
        "dispatcher at 127.0.0.1:" in first or "lost this run's input" in first
    ), first
    assert all("is not serving" in line for line in later), later  # a probe, before the start
    assert "the trainer lost a TPU worker or cluster peer" not in first
    records = [json.loads(p.read_text()) for p in sorted((model_dir / "runs").glob("*-train.json"))]
    served = [r["data_service"] for r in records if "data_service" in r]
    assert len(served) == 2 and served[0]["job_name"] != served[1]["job_name"], served
    step = served[1]["started_at_step"]
    assert step >= 20 and served[1]["input_starts_at"]["epoch"] >= 1, served[1]
    assert f"job {served[1]['job_name']}: resumed at step {step}" in supervised.log


@pytest.mark.slow
@pytest.mark.tpu_wheel
def test_a_fault_tolerant_dispatcher_killed_and_restarted_on_its_work_dir_serves_again(
    tmp_path,
):
    """--work_dir: the dispatcher journals its state there; SIGKILLed, then started again on
    the same port and work_dir, it is fault-tolerant again and its worker, which outlived
    it and said so, is back with it."""
    port, worker_port = free_local_ports(2)
    journal = tmp_path / "journal"
    first = Server("dispatcher", f"--port={port}", f"--work_dir={journal}")
    alone = worker(port, worker_port)
    second = None
    try:
        line = first.wait_for("serving on port")
        assert f"(fault-tolerant: its datasets and jobs are journaled in {journal}" in line
        alone.wait_for("registered with the dispatcher")
        first.wait_for(r"joined \(1 serving\)")
        heard = len(alone.lines)  # before the kill: the worker may say it at once
        assert first.end(signal.SIGKILL) == -signal.SIGKILL
        assert any(path.is_file() for path in journal.rglob("*")), "no journal written"
        alone.wait_for(f"the dispatcher at 127.0.0.1:{port} does not answer", start=heard)
        second = Server("dispatcher", f"--port={port}", f"--work_dir={journal}")
        assert "fault-tolerant" in second.wait_for("serving on port")
        second.wait_for(rf"worker 127\.0\.0\.1:{worker_port} (joined|answers again)")
        alone.wait_for(f"the dispatcher at 127.0.0.1:{port} answers again", start=heard)
    finally:
        for each in (first, alone, second):
            if each is not None and each.process.poll() is None:
                each.end(signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.tpu_wheel
def test_the_servers_stop_cleanly_on_sigterm(service):
    """Last: the module's servers, each one line per state change, end with exit 75."""
    dispatcher, *workers = service["servers"]
    assert f"serving on port {service['port']} (not fault-tolerant" in dispatcher.lines[0]
    assert all(any("registered with the dispatcher" in ln for ln in w.lines) for w in workers)
    for each in service["servers"]:
        each.process.send_signal(signal.SIGTERM)  # all at once: their stops take seconds
    for each in service["servers"]:
        assert each.end(None) == 75, each.lines
        assert each.lines[-2].endswith(": stopping"), each.lines
        assert each.lines[-1].endswith(": stopped (SIGTERM)"), each.lines
