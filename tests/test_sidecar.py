"""tpurun.runners.sidecar: `eval --continuous`, evaluating every checkpoint of a model_dir as it
appears, on fake checkpoint files and with fake evaluate/report callbacks.

Time is a FakeClock patched in as the sidecar's `time`: its polls cost nothing and a
timeout is exact. The sidecar beside a real training run is in test_train_and_eval.py.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from conftest import capture_info_logs
from fakes import FakeClock, delete_checkpoint, fake_checkpoint, step_of

from tpurun.errors import RunError
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.run_config.splits import Splits
from tpurun.runners import sidecar
from tpurun.runners.sidecar import POLL_SECONDS

# Iris's one split, and a model's test split beside its selecting val.
IRIS = Splits(names=("test",), best="test", chosen="test", also=())
ON_TEST = Splits(names=("val", "test"), best="val", chosen="test", also=())


def iris_run(model_dir: Path, **flags) -> RunConfig:
    """The RunConfig of `tpurun eval --continuous` on Iris, with config flags applied."""
    run_flags = {k: flags.pop(k) for k in ("eval_timeout",) if k in flags}
    config = merge_flags(config_files.load(config_files.resolve("iris")), flags)
    return RunConfig(
        command="eval",
        config_name="iris",
        config=config,
        model_dir=str(model_dir),
        continuous=True,
        **run_flags,
    )


class Sidecar:
    """Fake evaluate/report callbacks for evaluate_continuously: records the steps."""

    def __init__(self, on_report=None):
        self.evaluated: list[int] = []
        self.reported: list[int] = []
        self.on_report = on_report

    def evaluate(self, path: str) -> dict[str, float]:
        self.evaluated.append(step_of(path))
        return {"loss": 1.0 / step_of(path), "num_examples": 30, "global_step": step_of(path)}

    def report(self, path: str, results: dict[str, float]) -> None:
        self.reported.append(int(results["global_step"]))
        if self.on_report:
            self.on_report(results)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(sidecar, "time", clock.as_time_module())
    return clock


# --- The sidecar's loop, on fake checkpoints. -----------------------------------------


def test_sidecar_evaluates_each_checkpoint_once_in_step_order_and_stops_at_the_final_step(
    tmp_path, clock
):
    from tpurun.runners.sidecar import evaluate_continuously

    for step in (20, 10):
        fake_checkpoint(tmp_path, step)

    def trainer_saves_more(results):  # the trainer saves while the sidecar evaluates
        newest = max(step_of(str(p)[: -len(".index")]) for p in tmp_path.glob("ckpt-*.index"))
        if newest < 40:
            fake_checkpoint(tmp_path, newest + 10)

    sidecar = Sidecar(on_report=trainer_saves_more)
    line = evaluate_continuously(
        iris_run(tmp_path, train_steps=40, eval_timeout=30), sidecar.evaluate, sidecar.report, IRIS
    )
    assert sidecar.evaluated == sidecar.reported == [10, 20, 30, 40]
    assert "stopped after the checkpoint of the final step 40 (--train_steps=40)" in line
    assert "evaluated 4 checkpoint(s)" in line


def test_sidecar_skips_deleted_and_already_evaluated_checkpoints(tmp_path, clock):
    from tpurun.runners.sidecar import evaluate_continuously

    for step in (10, 20, 30, 40):
        fake_checkpoint(tmp_path, step)
    delete_checkpoint(tmp_path, 10)  # by keep_checkpoint_max, before the sidecar read it
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results-20.json").write_text("{}")  # by an earlier sidecar

    def evaluate(path):
        if step_of(path) == 30:  # deleted while being read
            delete_checkpoint(tmp_path, 30)
            from tpurun.storage.checkpoints import CheckpointGone

            raise CheckpointGone(f"checkpoint {path} is gone (data file not found)")
        return Sidecar().evaluate(path)

    sidecar = Sidecar()
    line = evaluate_continuously(
        iris_run(tmp_path, train_steps=40, eval_timeout=30), evaluate, sidecar.report, IRIS
    )
    assert sidecar.reported == [40]
    assert "final step 40" in line and "evaluated 1 checkpoint(s)" in line


def test_sidecar_on_one_split_evaluates_what_was_evaluated_on_another(tmp_path, clock):
    from tpurun.runners.sidecar import evaluate_continuously

    for step in (10, 20):
        fake_checkpoint(tmp_path, step)
    (tmp_path / "eval" / "val").mkdir(parents=True)
    (tmp_path / "eval" / "val" / "results-10.json").write_text("{}")  # a sidecar on val
    (tmp_path / "eval" / "results-20.json").write_text("{}")  # the old layout: val's
    (tmp_path / "eval" / "test").mkdir()
    (tmp_path / "eval" / "test" / "results-20.json").write_text("{}")  # a sidecar on test
    sidecar = Sidecar()
    evaluate_continuously(
        iris_run(tmp_path, train_steps=20, eval_timeout=30),
        sidecar.evaluate,
        sidecar.report,
        ON_TEST,
    )
    assert sidecar.reported == [10]


def test_sidecar_raises_an_eval_error_even_when_the_checkpoint_was_deleted_meanwhile(
    tmp_path, clock
):
    from tpurun.runners.sidecar import evaluate_continuously

    fake_checkpoint(tmp_path, 10)

    def evaluate(path):
        delete_checkpoint(tmp_path, 10)  # rotated away while its eval ran, and then
        raise RunError("Iris.input_fn(eval) yielded no examples")  # a real failure

    with pytest.raises(RunError, match="yielded no examples"):
        evaluate_continuously(
            iris_run(tmp_path, train_steps=40, eval_timeout=30), evaluate, print, IRIS
        )


def test_sidecar_read_error_of_a_checkpoint_still_there_is_raised(tmp_path, clock):
    import tensorflow as tf

    from tpurun.runners.sidecar import evaluate_continuously

    fake_checkpoint(tmp_path, 10)

    def evaluate(path):
        raise tf.errors.DataLossError(None, None, "checksum mismatch")

    with pytest.raises(tf.errors.DataLossError):
        evaluate_continuously(
            iris_run(tmp_path, train_steps=10, eval_timeout=30), evaluate, Sidecar().report, IRIS
        )


def test_sidecar_stops_after_eval_timeout_without_a_new_checkpoint(tmp_path, clock):
    from tpurun.runners.sidecar import evaluate_continuously

    fake_checkpoint(tmp_path, 10)
    sidecar = Sidecar()
    start = clock.now
    line = evaluate_continuously(
        iris_run(tmp_path, train_steps=100, eval_timeout=0.3),
        sidecar.evaluate,
        sidecar.report,
        IRIS,
    )
    # Polled until --eval_timeout had passed, and stopped at the first poll after it.
    assert 0.3 <= clock.now - start < 0.3 + POLL_SECONDS
    assert sidecar.reported == [10]
    assert "no new checkpoint" in line and "--eval_timeout" in line
    assert "final step 100 (--train_steps) is not reached" in line


def test_waiting_for_a_first_checkpoint_that_never_comes_is_an_error(tmp_path, clock):
    from tpurun.runners.sidecar import wait_for_checkpoint

    with pytest.raises(RunError, match="no checkpoint appeared in .* within --eval_timeout=0.2s"):
        wait_for_checkpoint(iris_run(tmp_path / "model", eval_timeout=0.2))
    assert not (tmp_path / "model").exists()


def test_waiting_sidecar_returns_once_a_checkpoint_appears(tmp_path, monkeypatch, caplog):
    from tpurun.runners.sidecar import wait_for_checkpoint

    capture_info_logs(caplog)
    clock = FakeClock()

    def sleep(seconds: float) -> None:  # the trainer saves its first checkpoint meanwhile
        clock.advance(seconds)
        if clock.now - start >= 5:
            fake_checkpoint(tmp_path / "model", 100)

    start = clock.now
    monkeypatch.setattr(
        sidecar, "time", types.SimpleNamespace(monotonic=clock.monotonic, sleep=sleep)
    )
    wait_for_checkpoint(iris_run(tmp_path / "model", eval_timeout=60))
    assert 5 <= clock.now - start < 5 + POLL_SECONDS
    assert caplog.messages.count(f"Waiting for a checkpoint in {tmp_path / 'model'}.") == 1


def test_saved_checkpoints_are_the_state_files_list_in_step_order(tmp_path):
    for step in (100, 20, 3):
        fake_checkpoint(tmp_path, step)
    (tmp_path / "ckpt-500.index").write_text("a save in progress: not in the state file yet")
    assert sidecar.saved_checkpoints(str(tmp_path)) == [
        str(tmp_path / f"ckpt-{step}") for step in (3, 20, 100)
    ]


@pytest.mark.parametrize("made", ["nothing", "empty_dir"])
def test_no_model_dir_or_state_file_means_no_checkpoints(tmp_path, made):
    if made == "empty_dir":
        (tmp_path / "model").mkdir()
    assert sidecar.saved_checkpoints(str(tmp_path / "model")) == []


@pytest.mark.parametrize(
    "deleted, expected", [((), True), ((".index",), False), ((".data-00000-of-00001",), False)]
)
def test_still_saved_needs_the_index_and_the_data(tmp_path, deleted, expected):
    path = fake_checkpoint(tmp_path, 10)
    for suffix in deleted:
        (tmp_path / f"ckpt-10{suffix}").unlink()
    assert sidecar.still_saved(path) is expected
