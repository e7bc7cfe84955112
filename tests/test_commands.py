"""tpurun.commands: the pieces of a run put together (the commands themselves run end to end
through the CLI in the scenario tests: test_e2e_iris.py, test_cli_errors.py, ...)."""

from __future__ import annotations

import inspect
import json
import os
import threading

import pytest
import tensorflow as tf
from tpurun.models.iris import Iris

from tpurun.commands import model_dir as commands_model_dir
from tpurun.commands import running
from tpurun.errors import RunError, tf_errors
from tpurun.run_config import RunConfig, command_table, config_files, flag_table, merge_flags


def iris_run(model_dir, command: str = "train", **fields) -> RunConfig:
    config = merge_flags(config_files.load(config_files.resolve("iris")), {})
    return RunConfig(command, "iris", config, model_dir=str(model_dir), **fields)


# The message a worker got when its chief was SIGKILLed mid-run (TensorFlow 2.21).
LOST_WORKER = (
    "Graph execution error:\n\nDetected at node while/CollectiveReduceV2 defined at (most "
    'recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main\n\n'
    "Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error "
    "information from remote target /job:worker/replica:0/task:0 while calling "
    "/tensorflow.WorkerService/CompleteInstance:\n:UNKNOWN:Error received from peer\n"
    "The error could be from a previous operation. Restart your program to reset.\n\t "
    "[[{{node while/CollectiveReduceV2}}]] [Op:__inference__host_loop_691]"
)


def test_alost_worker_reason_is_told_apart_from_unavailable_storage():
    import tensorflow as tf

    from tpurun.errors.tf_errors import lost_worker_reason

    lost = tf.errors.UnavailableError(None, None, LOST_WORKER)
    assert lost_worker_reason(lost) == "recvmsg:Connection reset by peer"
    storage = tf.errors.UnavailableError(None, None, "Error executing an HTTP request: 503")
    assert lost_worker_reason(storage) is None


@pytest.mark.parametrize(
    "message, reason",
    [
        ("Collective ops is aborted by: worker-1 left\nmore", "worker-1 left"),
        (
            "Graph execution error:\n\nDetected at node x\n"
            "failed to connect to all addresses; last error: /job:worker/replica:0/task:1\n",
            "failed to connect to all addresses; last error: /job:worker/replica:0/task:1",
        ),
    ],
    ids=["aborted_by", "a_job_named"],
)
def test_lost_worker_reason_is_the_line_that_says_why(message, reason):
    assert tf_errors.lost_worker_reason(tf.errors.UnavailableError(None, None, message)) == reason


def test_workers_probing_one_model_dir_at_once_all_find_it_writable(tmp_path):
    """Every worker of a cluster runs this check on the shared model_dir at the same time."""
    run = iris_run(tmp_path / "model")
    failures: list[Exception] = []

    def probe_many_times() -> None:
        for _ in range(200):
            try:
                commands_model_dir.prepare_model_dir(run)
            except Exception as e:  # noqa: BLE001 - collected and shown below
                failures.append(e)

    workers = [threading.Thread(target=probe_many_times) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures[:3]
    assert os.listdir(tmp_path / "model") == []  # no probe left behind


@pytest.mark.parametrize("exists", [False, True], ids=["new", "existing"])
def test_prepare_model_dir_says_whether_it_created_the_dir(tmp_path, exists):
    if exists:
        (tmp_path / "model").mkdir()
    assert commands_model_dir.prepare_model_dir(iris_run(tmp_path / "model")) is not exists
    assert os.listdir(tmp_path / "model") == []


def test_an_unwritable_model_dir_is_a_run_error_naming_it(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(RunError, match=r"cannot write to --model_dir=.*/afile/model \("):
        commands_model_dir.prepare_model_dir(iris_run(tmp_path / "afile" / "model"))


def test_the_run_record_is_the_run_config_with_versions(tmp_path, capsys):
    run = iris_run(tmp_path, "eval")
    path, written = commands_model_dir.write_record(run)
    assert json.loads(open(path).read()) == written
    assert path.startswith(str(tmp_path / "runs")) and path.endswith("-eval.json")
    record = json.loads(open(path).read())
    assert record["run_config"]["command"] == "eval"
    assert record["versions"]["tensorflow"] == tf.__version__
    assert capsys.readouterr().err == f"tpurun eval: model_dir {tmp_path}\n"


class Diagnosing(Iris):
    """Iris whose diagnose_data answers, or fails, as told."""

    answer: object = None

    def diagnose_data(self, mode):
        if isinstance(self.answer, Exception):
            raise self.answer
        return f"{self.answer} ({mode.value})" if self.answer else None


ERROR = tf.errors.InvalidArgumentError(None, None, "Key: label. Data types don't match")


@pytest.mark.parametrize(
    "command, answer, expected",
    [
        ("train", "data file x, record 3: bad", "data file x, record 3: bad (train)"),
        ("eval", "data file y, record 1: bad", "data file y, record 1: bad (eval)"),
        ("predict", None, None),  # the data are fine: TensorFlow's own error is shown
        ("export", "never asked", None),  # export reads no data
    ],
)
def test_diagnose_data_asks_the_model_about_the_commands_data(tmp_path, command, answer, expected):
    model = Diagnosing(iris_run(tmp_path).config)
    model.answer = answer
    assert running.diagnose_data(iris_run(tmp_path, command), model, ERROR) == expected


def test_a_failing_diagnosis_is_a_warning_and_hides_nothing(tmp_path, caplog):
    model = Diagnosing(iris_run(tmp_path).config)
    model.answer = OSError("cannot read the data again")
    assert running.diagnose_data(iris_run(tmp_path), model, ERROR) is None
    assert "Diagnosing.diagnose_data(train) failed: cannot read the data again" in caplog.messages


def test_diagnose_data_leaves_a_generating_model_alone(tmp_path):
    class Generating(Diagnosing):
        answer = "not asked"

        def generate(self, keras_model, strategy):
            return []

    model = Generating(iris_run(tmp_path).config)
    # predict ran generate(), not input_fn(PREDICT): the data are not what failed.
    assert running.diagnose_data(iris_run(tmp_path, "predict"), model, ERROR) is None
    # Its train data still are.
    assert running.diagnose_data(iris_run(tmp_path), model, ERROR) == "not asked (train)"


@pytest.mark.parametrize("command", command_table.COMMANDS, ids=lambda c: c.name)
def test_every_command_names_the_function_that_runs_it(command):
    """The table names each function as text (the CLI imports no TensorFlow): a renamed
    or moved function fails here, not when a user runs the command."""
    function = command.function()
    assert callable(function)
    # What the CLI calls it with, by what the command parses and does with model_dir.
    takes = len(inspect.signature(function).parameters)
    if command.parses is not command_table.Parses.CONFIG:
        assert takes == (1 if command.words else 0)  # the word its line takes first, if any
    elif command.model_dir is command_table.ModelDir.NONE:
        assert takes >= 1  # check: the RunConfig (and where to print)
    else:
        assert takes == 2  # the RunConfig and what commands.run prepared


def test_the_table_and_the_flag_table_know_the_same_commands():
    assert list(flag_table.COMMAND_FLAGS) == [c.name for c in command_table.COMMANDS]
    named = {name for flag in flag_table.FLAGS for name in flag.commands}
    assert named <= set(command_table.COMMAND)


def test_the_time_account_records_what_the_replicas_run_on(tmp_path, monkeypatch):
    """A cluster's device kind when it stands for another (check's stand-ins), else what
    its strategy's devices are: a TPU run's cluster leaves it to its TPUStrategy, whose
    devices say TPU (stood in for here: no TPU on this machine), never "CPU"."""
    from tpurun.cluster import Cluster, machines

    monkeypatch.setattr(machines, "device_kind", lambda strategy: "TPU")
    for given, recorded in (("", "TPU"), ("GPU", "GPU")):
        cluster = Cluster(tf.distribute.get_strategy(), "a run's", device_kind=given)
        account = running.start_account(str(tmp_path / "run.json"), {}, cluster, 1.0)
        assert account.account.device is not None
        assert account.account.device.kind == recorded
