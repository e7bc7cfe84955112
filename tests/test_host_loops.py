"""The device-data host loop's choice: config.train.xla="auto" runs a short run's plain loop
untimed, else times XLA's loop and the plain one on the model's step and trains with the
faster; model_dir keeps the choice, and a resumed run runs the loop its checkpoints were
trained with.

The decision rule is tested on given times (which loop is faster on this machine is
never asserted); the run below fixes the rule's thresholds, so that it decides the same
whatever the machine's load, and times both loops for real.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_ok, needs_xla_cpu

from tpurun import model as model_lib
from tpurun.cluster import strategy
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.runners import host_loops
from tpurun.runners.host_loops import (
    PLAIN_MARGIN,
    SHORT_RUN_STEPS,
    TINY_STEP_S,
    DeviceLoop,
    LoopTimes,
)
from tpurun.runners.train import Trainer

IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10")
MS = 1e-3
measured = LoopTimes.measured  # the times, and the loop they choose


@pytest.mark.parametrize(
    "times, xla",
    [
        (measured(plain=3 * MS, xla=1 * MS, steps=8), True),  # XLA faster
        (measured(plain=1 * MS, xla=1.2 * MS, steps=8), True),  # slower, within the margin
        (measured(plain=1 * MS, xla=PLAIN_MARGIN * MS, steps=8), False),  # at the margin
        (measured(plain=100 * MS, xla=700 * MS, steps=1), False),  # keras-io's DCGAN
        (measured(plain=None, xla=TINY_STEP_S / 2, steps=512), True),  # tiny: plain untimed
        (measured(plain=None, xla=None, steps=0, xla_error="no kernel"), False),  # XLA failed
        (LoopTimes.short_run(SHORT_RUN_STEPS), False),  # neither timed
    ],
    ids=["faster", "within-margin", "at-margin", "much-slower", "tiny", "xla-failed", "short"],
)
def test_xla_runs_unless_it_failed_or_the_plain_loop_is_clearly_faster(times, xla):
    assert times.use_xla is xla
    # What model_dir keeps gives the same loop back.
    assert LoopTimes.from_record(json.loads(json.dumps(times.as_record()))) == times


@pytest.mark.parametrize(
    "record",
    [
        None,
        [1, 2],
        {"plain": 0.001},  # no xla, no steps
        {"plain": "fast", "xla": 0.001, "steps": 8, "use_xla": True},
        {"plain": 0.001, "xla": 0.001, "steps": "8", "use_xla": True},
        {"plain": 0.001, "xla": 0.001, "steps": 8},  # no choice
        {"plain": None, "xla": None, "steps": 0, "use_xla": False},  # neither, no error
        {"plain": None, "xla": None, "steps": 0, "use_xla": True, "xla_error": "failed"},
        {"plain": -1.0, "xla": 0.001, "steps": 8, "use_xla": True},
        {"plain": 0.001, "xla": 0.001, "steps": 8, "use_xla": True, "winner": "xla"},
        {"plain": None, "xla": None, "steps": 0, "use_xla": False, "run_steps": "20"},
        {"plain": None, "xla": None, "steps": 0, "use_xla": False, "run_steps": -20},
    ],
)
def test_a_record_not_in_this_form_gives_no_times(record):
    assert LoopTimes.from_record(record) is None


def test_the_log_says_what_was_timed_and_why():
    assert LoopTimes.measured(0.0034, 0.0012, 100).shown() == (
        "1.2 ms a step with XLA against 3.4 ms without (2.8x faster), timed on 100 steps each"
    )
    assert LoopTimes.measured(0.1, 0.7, 1).shown() == (
        "700 ms a step with XLA against 100 ms without (7.0x slower, 1.3x or more), "
        "timed on 1 step each"
    )
    assert (
        LoopTimes.measured(0.001, 0.0012, 8)
        .shown()
        .endswith("(1.2x slower, less than 1.3x), timed on 8 steps each")
    )
    assert LoopTimes.measured(None, 6e-5, 4096).shown() == (
        "0.06 ms a step with XLA, timed on 4096 steps: under 1 ms, faster than its ops "
        "dispatched one by one"
    )
    assert LoopTimes.measured(None, None, 0, "no XLA kernel for PyFunc").shown() == (
        "XLA could not compile the step (no XLA kernel for PyFunc)"
    )
    assert LoopTimes.short_run(20).shown() == (
        f"the run's 20 steps are too few for XLA's compile to pay for itself (at most "
        f"{SHORT_RUN_STEPS}: neither loop timed)"
    )


def weights(model_dir, step: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(model_dir / f"ckpt-{step}"))
    names = reader.get_variable_to_shape_map()
    return {n: reader.get_tensor(n) for n in names if n.endswith("VARIABLE_VALUE")}


def loop_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if "Training data on the device" in line]
    return line


@needs_xla_cpu  # it times the XLA-compiled loop
def test_auto_records_its_choice_and_a_resume_keeps_it_bit_identically(
    tpurun_cli, tmp_path, monkeypatch
):
    """With the rule fixed to choose the plain loop, "auto" compiles and times both loops
    (in log lines that say when and how long, without a terminal), puts the state back
    and trains exactly what a run forcing the plain loop trains; the resumed run keeps
    the recorded choice although the rule now says XLA."""
    monkeypatch.setattr(host_loops, "SHORT_RUN_STEPS", 0)  # time a run of 20 steps
    monkeypatch.setattr(host_loops, "TINY_STEP_S", 0.0)  # time the plain loop too
    monkeypatch.setattr(host_loops, "PLAIN_MARGIN", 1e-9)  # and choose it, whatever the times
    monkeypatch.setattr(host_loops, "CALL_SECONDS", 0.0)  # on calls of one step: cheaper
    auto = (*IRIS, f"--model_dir={tmp_path / 'auto'}")
    first = assert_ok(tpurun_cli("train", *auto, "--train_steps=20"))
    for how in ("with", "without"):
        compiled = f"Compiled the host loop of Iris's train_step {how} XLA"
        assert re.search(rf"{re.escape(compiled)} in \d+\.\ds\.", first.stderr), first.stderr
    assert "Compiling the host loop of Iris's train_step with XLA (to time it" in first.stderr
    line = loop_line(first.stderr)
    assert re.search(
        r"the host loop is not compiled by XLA: [\d.]+ ms a step with XLA against [\d.]+ ms "
        r"without \(.*\), timed on \d+ steps? each \(config.train.xla='auto'",
        line,
    ), line
    record = json.loads((tmp_path / "auto" / "train_config.json").read_text())
    times = LoopTimes.from_record(record["__loop_times__"])
    assert times is not None and times.plain and times.xla and not times.use_xla

    monkeypatch.setattr(host_loops, "PLAIN_MARGIN", float("inf"))  # now the rule says XLA
    resumed = assert_ok(tpurun_cli("train", *auto, "--train_steps=40"))
    assert "Resuming from" in resumed.stderr
    assert "to time it" not in resumed.stderr
    assert loop_line(resumed.stderr).endswith(
        f"the host loop is not compiled by XLA, as this model_dir's first run chose it "
        f"({times.shown()}; config.train.xla='auto'; true or false forces one)."
    )
    # The first loop of a run that does not time compiles in two lines too.
    assert re.search(r"Compiled the host loop of Iris's train_step in \d+\.\ds\.", resumed.stderr)
    kept = json.loads((tmp_path / "auto" / "train_config.json").read_text())["__loop_times__"]
    assert kept == record["__loop_times__"]

    plain = (*IRIS, f"--model_dir={tmp_path / 'plain'}", "--config.train.xla=false")
    forced = assert_ok(tpurun_cli("train", *plain, "--train_steps=40"))
    assert "to time it" not in forced.stderr
    a, b = weights(tmp_path / "auto", 40), weights(tmp_path / "plain", 40)
    assert a.keys() == b.keys()
    assert [name for name in a if not np.array_equal(a[name], b[name])] == []


def test_a_short_run_runs_the_plain_loop_untimed_and_its_resume_keeps_it(
    tpurun_cli, tmp_path, monkeypatch
):
    """A run of at most SHORT_RUN_STEPS compiles only the plain loop, says why, and records
    it; resumed with more steps than that, it keeps the plain loop, bit-identical to a
    run forcing it."""
    # A threshold of 20 steps: the first run's 20 are short, the resume's 30 are not (it
    # would time both loops but for the record); 500's runs would be 25x longer.
    monkeypatch.setattr(host_loops, "SHORT_RUN_STEPS", 20)
    short = host_loops.SHORT_RUN_STEPS
    auto = (*IRIS, f"--model_dir={tmp_path / 'auto'}")
    first = assert_ok(tpurun_cli("train", *auto, "--train_steps=20"))
    assert "to time it" not in first.stderr and "with XLA" not in first.stderr
    assert loop_line(first.stderr).endswith(
        f"the host loop is not compiled by XLA: {LoopTimes.short_run(20).shown()} "
        "(config.train.xla='auto'; true or false forces one)."
    )
    record = json.loads((tmp_path / "auto" / "train_config.json").read_text())
    assert LoopTimes.from_record(record["__loop_times__"]) == LoopTimes.short_run(20)
    longer = f"--train_steps={short + 30}"
    resumed = assert_ok(tpurun_cli("train", *auto, longer))
    assert "Resuming from" in resumed.stderr and "to time it" not in resumed.stderr
    assert "as this model_dir's first run chose it (the run's 20 steps" in loop_line(resumed.stderr)
    plain = (*IRIS, f"--model_dir={tmp_path / 'plain'}", "--config.train.xla=false")
    assert_ok(tpurun_cli("train", *plain, longer))
    a, b = (
        weights(tmp_path / "auto", short + 30),
        weights(tmp_path / "plain", short + 30),
    )
    assert [name for name in a if not np.array_equal(a[name], b[name])] == []


def iris_trainer(model_dir, **train) -> Trainer:
    """A Trainer of Iris's config on 1 CPU replica, with `train`'s config.train keys set."""
    source = config_files.resolve("iris")
    config = config_files.load(source)
    config.train.update(train)
    run = RunConfig("train", source.name, merge_flags(config, {}), str(model_dir), use_tpu=False)
    return Trainer(run, strategy.build(run), model_lib.create(run.config))


@pytest.mark.parametrize(
    "run_steps, timed", [(SHORT_RUN_STEPS, False), (SHORT_RUN_STEPS + 1, True)]
)
def test_auto_times_the_loops_only_for_a_run_longer_than_short(
    run_steps, timed, monkeypatch, tmp_path
):
    def time_both(self):
        self.compiled = True
        return LoopTimes.measured(None, TINY_STEP_S / 2, 8)

    monkeypatch.setattr(DeviceLoop, "time_both", time_both)
    trainer = iris_trainer(tmp_path, steps=run_steps)
    trainer.start_input(lambda: None)  # a fresh run: no record
    expected = (
        LoopTimes.measured(None, TINY_STEP_S / 2, 8) if timed else LoopTimes.short_run(run_steps)
    )
    assert trainer.loop_times == expected
    assert trainer._loop.compiled is timed


@pytest.mark.parametrize("xla", [True, False])
def test_the_users_choice_is_kept_untimed(xla, monkeypatch, tmp_path):
    def not_timed(self):
        raise AssertionError("timed although config.train.xla was given")

    monkeypatch.setattr(DeviceLoop, "time_both", not_timed)
    trainer = iris_trainer(tmp_path, xla=xla)
    trainer.start_input(lambda: LoopTimes.measured(1.0, 1.0, 1))  # a record, not read
    loop = trainer._loop
    assert isinstance(loop, DeviceLoop) and loop.compiled is xla
    assert loop.describe() == (
        f"the host loop is {'' if xla else 'not '}compiled by XLA "
        f"(config.train.xla={str(xla).lower()})"
    )
    assert trainer.loop_times is None


# --- the input wait, timed around each fetch ------------------------------------------


@pytest.fixture(params=[False, True], ids=["tf.timestamp", "op determinism: the host's clock"])
def op_determinism(request):
    """TensorFlow's op determinism off, then on (as config.train.deterministic sets it), put
    back after the test."""
    from tpurun import tf_internals

    was = tf_internals.op_determinism_enabled()
    tf_internals.set_op_determinism(request.param)
    yield request.param
    tf_internals.set_op_determinism(was)


def test_the_input_loop_times_its_waits_for_batches_under_op_determinism_too(op_determinism):
    """Each batch takes 30 ms to make and the step nothing: the loop's 6 steps waited for
    most of 180 ms (the while loop's next fetch may start before a step's end), under op
    determinism (where tf.timestamp is refused) timed by the host's clock."""
    import time

    def slow(x):
        time.sleep(0.03)
        return x

    batches = tf.data.Dataset.range(100).map(
        lambda x: (
            (tf.numpy_function(slow, [tf.cast(x, tf.float32)], tf.float32, stateful=False),) * 2
        )
    )
    unprefetched = tf.data.Options()  # each batch made when the step asks for it
    unprefetched.experimental_optimization.inject_prefetch = False
    batches = batches.with_options(unprefetched)
    loop = host_loops.InputLoop(
        host_loops.LoopParts(
            strategy=tf.distribute.get_strategy(),
            replica_step=lambda features, labels: {"x": features + labels},
            summed=lambda scalars: tf.pad(tf.reshape(scalars["x"], [1]), [[0, 15]]),
            finite=lambda: tf.constant(True),
            global_step=tf.Variable(0, dtype=tf.int64),
            rates=lambda: tf.zeros([1]),
            model_name="Slow",
        ),
        iter(batches),
    )
    waited = float(loop.run(6).waited)
    assert 0.09 < waited < 5.0, waited
    traced = loop._loop.get_concrete_function(loop.iterator, tf.constant(6)).graph.as_graph_def()
    ops = {n.op for f in traced.library.function for n in f.node_def}  # the while loop's body
    assert ("Timestamp" in ops) is not op_determinism, ops
