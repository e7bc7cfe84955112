"""Every failure names its cause on its one line: the user's code, nonsense values, rows.

"unexpected" is kept for tpurun's own bugs: an error a user or a crash can cause
says what and where. Runs are in-process (the tpurun_cli fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import RUN_FAILURE, USAGE, assert_fails, assert_ok

# A model whose layer raises while the train step is traced: autograph wraps the
# error as "in user code:"; the user must see their message and their line.
TRACED_BUG = """
import keras
import tensorflow as tf

from tpurun.model import Classifier, register


class Culprit(keras.layers.Layer):
    def call(self, x, training=None):
        if training:  # not while the model is built: while the train step is traced
            raise ValueError("the shapes of my layer are wrong")
        return x


@register("traced_bug")
class TracedBug(Classifier):
    def input_fn(self, mode, params):
        x = tf.zeros([16, 4])
        y = tf.zeros([16], tf.int32)
        data = tf.data.Dataset.from_tensor_slices((x, y) if mode != "predict" else x)
        if mode == "train":
            return data.repeat().batch(params.batch_size, drop_remainder=True)
        return data.batch(params.batch_size)

    def build(self):
        inputs = keras.Input((4,))
        return keras.Model(inputs, Culprit()(keras.layers.Dense(3)(inputs)))
"""
CONFIG = """
from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="traced_bug")
    config.model_module = "traced_bug_model"
    config.train.batch_size = 8
    return config
"""


def test_an_error_in_traced_user_code_shows_the_users_message_and_line(tpurun_cli, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "traced_bug_model.py").write_text(TRACED_BUG)
    (project / "traced_bug.py").write_text(CONFIG)
    result = tpurun_cli(
        "train", f"--config={project / 'traced_bug.py'}", "--train_steps=1", cwd=tmp_path
    )
    line = assert_fails(
        result,
        RUN_FAILURE,
        "ValueError in your code at project/traced_bug_model.py:11: Exception encountered",
        "the shapes of my layer are wrong",
    )
    assert "unexpected" not in line and "in user code" not in line


def test_a_bug_of_tpurun_itself_is_still_called_unexpected(tpurun_cli, tmp_path, monkeypatch):
    import functools

    from tpurun import commands

    # Raised from tpurun's own call, with no user code on the way: a lookup that fails.
    monkeypatch.setattr(commands.running, "write_record", functools.partial(dict.__getitem__, {}))
    result = tpurun_cli("train", "--train_steps=1", f"--model_dir={tmp_path / 'm'}")
    assert_fails(result, RUN_FAILURE, "unexpected KeyError: RunConfig(")


def _from_c_code() -> SystemError:
    """What a SIGTERM's StoppedBySigterm becomes when it is raised while C code runs (an
    import, a TensorFlow call): the SystemError that code raises, with it as the cause."""
    from tpurun import errors

    try:
        try:
            raise errors.StoppedBySigterm
        except errors.StoppedBySigterm as e:
            raise SystemError(
                "<built-in function __import__> returned a result with an exception set"
            ) from e
    except SystemError as e:
        return e


def test_a_sigterm_raised_inside_c_code_still_exits_75_with_its_line(
    tpurun_cli, tmp_path, monkeypatch
):
    """Seen under load: the SIGTERM of a start-up landed in an import inside TensorFlow."""
    from tpurun import commands, errors

    def stopped(run) -> None:
        raise _from_c_code()

    monkeypatch.setattr(commands, "run", stopped)
    result = tpurun_cli("train", "--train_steps=1", f"--model_dir={tmp_path / 'm'}")
    assert result.returncode == errors.EXIT_PREEMPTED, result.stderr
    assert result.stderr.splitlines() == [f"tpurun train: error: {errors.StoppedBySigterm()}"]
    assert errors.caused_by_sigterm(_from_c_code())
    assert not errors.caused_by_sigterm(SystemError("a SystemError of its own"))


class Finalised:
    """Raises `error` from its __del__: an exception Python drops (sys.unraisablehook)."""

    def __init__(self, error: BaseException):
        self.error = error

    def __del__(self):
        raise self.error


def test_a_sigterm_python_cannot_raise_is_not_printed_and_others_still_are():
    """Where Python drops an exception (a __del__, a weakref callback, the garbage
    collector's finaliser), a StoppedBySigterm is not printed as a traceback: it was seen,
    and the run stops before its restore. Any other dropped exception still is (by
    the hook there was before: here a recorder in place of Python's printer)."""
    import signal
    import sys

    from tpurun import errors

    dropped: list[BaseException] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: dropped.append(unraisable.exc_value)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        errors.stop_at_sigterm()
        errors.stop_at_sigterm()  # twice, as __main__ and then cli.main do: wrapped once
        Finalised(_from_c_code())  # dropped at once: nothing refers to it
        assert dropped == []
        Finalised(ValueError("a bug of its own"))
        assert [str(e) for e in dropped] == ["a bug of its own"]
    finally:
        signal.signal(signal.SIGTERM, handler)
        sys.unraisablehook = previous


def test_a_sigterm_that_c_code_prints_is_not_printed_and_others_still_are():
    """C code that catches a Python error and goes on prints it through sys.excepthook
    (PyErr_Print): a StoppedBySigterm under it is not printed (the run stops before its
    restore, with its line), any other error still is, by the hook there was before."""
    import signal
    import sys

    from tpurun import errors

    printed: list[BaseException] = []
    previous = sys.excepthook
    sys.excepthook = lambda kind, error, trace: printed.append(error)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        errors.stop_at_sigterm()
        errors.stop_at_sigterm()  # wrapped once
        error = _from_c_code()
        sys.excepthook(type(error), error, error.__traceback__)
        assert printed == []
        bug = ValueError("a bug of its own")
        sys.excepthook(ValueError, bug, None)
        assert printed == [bug]
    finally:
        signal.signal(signal.SIGTERM, handler)
        sys.excepthook = previous


def test_what_tensorflow_drops_after_swallowing_a_sigterm_is_not_printed():
    """Seen under load (test_durability, SIGTERM before the model is built): a SIGTERM inside
    nest.flatten's C++ type checks, which call Python (the ABCs' __instancecheck__), is
    swallowed there and TensorFlow goes on with a TypeError of its own left set; its next
    import drops CPython's SystemError ("... returned a result with an exception set")
    through PyErr_WriteUnraisable(NULL), chained to that TypeError, not to the
    StoppedBySigterm (errors.caused_by_sigterm). Here the handler runs at every Python call
    such a flatten makes, in turn, as a signal landing there would: nothing is printed. The
    same SystemError without a SIGTERM before still is."""
    import signal
    import sys

    from tensorflow.python.util import _pywrap_utils, nest

    from tpurun import errors

    utils = _pywrap_utils.__name__  # the module of flatten's C++ (Flatten)
    dropped: list[BaseException] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: dropped.append(unraisable.exc_value)
    handler = signal.getsignal(signal.SIGTERM)
    moment = 0
    try:
        errors.stop_at_sigterm()
        while moment < 60:  # each moment of one flatten, until its Python calls run out
            moment += 1
            calls = inside = 0

            def profile(frame, event, arg, moment=moment):
                nonlocal calls, inside
                if event in ("c_call", "c_return", "c_exception"):
                    if getattr(arg, "__module__", None) == utils:
                        inside += 1 if event == "c_call" else -1
                elif event == "call" and inside:
                    calls += 1
                    if calls == moment:
                        sys.setprofile(None)
                        signal.raise_signal(signal.SIGTERM)

            class Fresh:  # a type flatten has not checked yet: its checks call Python
                pass

            sys.setprofile(profile)
            try:
                nest.flatten([Fresh(), Fresh()])
            except (errors.StoppedBySigterm, Exception):  # raised, not printed: not here
                pass
            finally:
                sys.setprofile(None)
            if calls < moment:
                break
        assert moment > 10 and errors.sigterm_seen()  # the handler ran inside flatten
        assert [f"{type(e).__name__}: {e}" for e in dropped] == []

        errors.sigterm._SIGTERM_SEEN.clear()  # noqa: SLF001 - no SIGTERM came: a real error prints
        left_set = SystemError(
            "<built-in function __import__> returned a result with an exception set"
        )
        left_set.__cause__ = TypeError("")
        Finalised(left_set)
        assert dropped == [left_set]
    finally:
        sys.setprofile(None)
        signal.signal(signal.SIGTERM, handler)
        sys.unraisablehook = previous
        errors.sigterm._SIGTERM_SEEN.clear()  # noqa: SLF001 - the next tests' runs are not stopped


# --- nonsense values: one line with the allowed range --------------------------------


@pytest.mark.parametrize(
    "flag, keywords",
    [
        ("--hang_timeout=nan", ["--hang_timeout=nan", "seconds >= 0 (0 = never), at most"]),
        ("--hang_timeout=inf", ["--hang_timeout=inf", "at most 2592000"]),
        ("--eval_timeout=-3", ["--eval_timeout=-3", "seconds >= 0"]),
        ("--tpu_init_timeout=nan", ["--tpu_init_timeout=nan", "seconds > 0"]),
        (
            "--predict_batch_size=10000000",
            ["=10000000 must be a positive integer (at most 1048576)"],
        ),
        ("--batch_size=0", ["--batch_size (config.train.batch_size)=0 must be a positive integer"]),
        ("--eval_batch_size=-8", ["--eval_batch_size (config.eval.batch_size)=-8", "positive"]),
        (
            "--batch_size=10000000000000000000",
            ["=10000000000000000000 must be a positive integer of at most 2^63-1", "--target"],
        ),
        ("--config.train.batch_size=32.5", ["config.train.batch_size", "integer"]),
        ("--iterations=100000000", ["--iterations", "(at most 1000000)"]),
        ("--seed=-1", ["--seed (config.seed)=-1", ">= 0 and at most 4294967295"]),
        ("--num_shards=100000", ["--num_shards=100000", "(at most 65536)"]),
        ("--compile_timeout=0", ["--compile_timeout=0", "seconds > 0"]),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_nonsense_value_is_refused_with_its_range(tpurun_cli, tmp_path, flag, keywords):
    command = "predict" if "predict" in flag else "eval" if "eval_timeout" in flag else "train"
    command = "check" if "compile_timeout" in flag else command
    result = tpurun_cli(command, flag, f"--model_dir={tmp_path / 'm'}", cwd=tmp_path)
    assert_fails(result, USAGE, *keywords)
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_pod_batch_past_2_20_is_sized_not_refused(tpurun_cli, tmp_path):
    """A v4-4096 (2,048 replicas) at 1,024 per replica: 2,097,152, a real pod job; what a
    slice holds is check --target's answer, not a constant's."""
    result = tpurun_cli(
        "check",
        "--config=iris",  # a tiny model: the check compiles its steps in seconds
        "--target=v4-4096",
        "--batch_size=2097152",
        "--eval_batch_size=16384",
        "--predict_batch_size=16384",
        "--input_check=false",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "must be a positive integer" not in result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.strip().startswith("batch per")]
    assert row.split()[3] == "1024", result.stdout  # the train step, sized at 1,024 per replica
    assert "a TPU with 2048 replicas (a v4-4096)" in result.stdout


# --- predict input: one output per data row -------------------------------------------

ROWS = ["5.1,3.3,1.7,0.5", "5.9,3.0,4.2,1.5", "6.9,3.1,5.4,2.1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    import keras

    from tpurun import cli

    model_dir = tmp_path_factory.mktemp("causes") / "model"
    keras.backend.clear_session()
    assert cli.main(["tpurun", "train", "--train_steps=10", f"--model_dir={model_dir}"]) == 0
    return model_dir


@pytest.mark.parametrize(
    "first_line",
    ["", "SepalLength,SepalWidth,PetalLength,PetalWidth", "3,4,setosa,versicolor,virginica"],
    ids=["no_header", "names", "tutorial_count_line"],
)
def test_predict_gives_one_output_per_data_row(tpurun_cli, trained, tmp_path, first_line):
    rows = tmp_path / "rows.csv"
    rows.write_text("".join(line + "\n" for line in ([first_line] if first_line else []) + ROWS))
    output = tmp_path / "out.jsonl"
    args = ("predict", f"--model_dir={trained}", f"--input={rows}", f"--output={output}")
    assert_ok(tpurun_cli(*args))
    lines = output.read_text().splitlines()
    assert len(lines) == 3
    assert [len(json.loads(line)["probabilities"]) for line in lines] == [3, 3, 3]


def test_predict_refuses_a_first_line_that_is_neither_header_nor_data(
    tpurun_cli, trained, tmp_path
):
    rows = tmp_path / "rows.csv"
    rows.write_text("length,width,x,y\n" + "\n".join(ROWS) + "\n")
    result = tpurun_cli("predict", f"--model_dir={trained}", f"--input={rows}")
    assert_fails(
        result,
        RUN_FAILURE,
        f"data file {rows}, line 1",
        "neither a header",
        "nor a row of 4 numbers",
    )


def test_predict_refuses_a_non_finite_input_with_its_row_and_column(tpurun_cli, trained, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("\n".join([ROWS[0], "5.9,inf,4.2,1.5", ROWS[2]]) + "\n")
    result = tpurun_cli("predict", f"--model_dir={trained}", f"--input={rows}")
    assert_fails(result, RUN_FAILURE, "line 2: column SepalWidth is 'inf'", "not a finite number")


@pytest.mark.parametrize("value", ["1e39", "-1e39"])
def test_predict_refuses_a_value_past_float32_with_its_row_and_column(
    tpurun_cli, trained, tmp_path, value
):
    """Finite to pandas (float64), infinite as the float32 feature the model would get."""
    rows = tmp_path / "rows.csv"
    rows.write_text("\n".join([ROWS[0], ROWS[1], f"6.9,3.1,{value},2.1"]) + "\n")
    result = tpurun_cli("predict", f"--model_dir={trained}", f"--input={rows}")
    line = assert_fails(
        result,
        RUN_FAILURE,
        f"line 3: column PetalLength is '{value}', past float32's range (magnitudes up to 3.4e+38)",
        "give every value as a finite float32 number",
    )
    assert "overflow" not in result.stderr.replace(line, "")  # no numpy warning before it
    assert "Prediction" not in result.stdout


def test_predictions_are_strict_json_even_when_not_finite():
    import numpy as np

    from tpurun.model import json_line

    line = json_line({"logits": np.array([1.0, np.nan, -np.inf], np.float32), "id": np.int32(2)})
    assert json.loads(line) == {"logits": [1.0, None, None], "id": 2}
    assert "NaN" not in line and "Infinity" not in line


def test_a_sigterm_swallowed_at_start_up_ends_the_run_before_it_trains(
    tpurun_cli, tmp_path, monkeypatch
):
    """A SIGTERM whose StoppedBySigterm C code swallowed at start-up (seen: `sigterm_seen`)
    ends the run as one stopped at start-up does, before the restore: TensorFlow may have
    gone on with its work half done, so nothing built then is trained or saved."""
    import threading

    from tpurun import errors

    seen = threading.Event()
    seen.set()
    monkeypatch.setattr(errors.sigterm, "_SIGTERM_SEEN", seen)
    model_dir = tmp_path / "model"
    result = tpurun_cli("train", "--config=iris", "--train_steps=20", f"--model_dir={model_dir}")
    assert result.returncode == errors.EXIT_PREEMPTED, result.stderr
    assert [line for line in result.stderr.splitlines() if ": error: " in line] == [
        f"tpurun train: error: {errors.StoppedBySigterm()}"
    ]
    assert "Training from step" not in result.stderr, result.stderr
    assert not list(model_dir.glob("ckpt-*")) and not list(model_dir.glob("checkpoint"))
