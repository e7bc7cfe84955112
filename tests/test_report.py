"""tpurun report's arithmetic on synthetic run records (no training), and the command in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_fails, assert_ok, error_lines

from tpurun import report
from tpurun.layout.time_account import from_json
from tpurun.report import goodput as arithmetic
from tpurun.report.goodput import CATEGORIES

STEP = 0.01  # seconds a steady step takes in these records


def process(
    start: float,
    first_step: int,
    last_step: int,
    *,
    startup: float = 5.0,
    compile_s: float = 2.0,
    saves: tuple[int, ...] = (),
    blocking: float = 0.1,
    end: str | None = "finished",
    input_seconds: float = 0.0,
    updated_step: int | None = None,
    death: dict | None = None,
    restart: int | None = None,
    evaluations: tuple[float, ...] = (),
    loop: int = 10,
) -> dict:
    """The goodput object of a process that trained first_step..last_step in loops of `loop`
    steps, STEP seconds each (its first loop `compile_s` longer), with no gaps between loops
    but the saves' and evaluations' blocking time."""
    begin = start + startup
    steps = last_step - first_step
    seconds = steps * STEP + compile_s + input_seconds
    t = begin
    saved = []
    for step in saves:
        saved.append(
            {"step": step, "t": begin + (step - first_step) * STEP, "blocking_s": blocking}
        )
    done = begin + seconds + blocking * len(saves) + sum(evaluations)
    record = {
        "process_start": start,
        "training_start": {"t": begin, "step": first_step},
        "first_loop": {"steps": loop, "seconds": loop * STEP + compile_s, "input_seconds": 0.0},
        "loops": {
            "count": steps // loop,
            "steps": steps,
            "seconds": seconds,
            "input_seconds": input_seconds,
        },
        "last": {"step": updated_step or last_step, "t": done},
        "saves": saved,
        "evaluations": [{"step": first_step, "t": t, "seconds": s} for s in evaluations],
        "updated": done,
    }
    if updated_step is not None:  # killed: its record was last written at updated_step
        record["loops"]["steps"] = updated_step - first_step
        record["loops"]["seconds"] = (updated_step - first_step) * STEP + compile_s
        record["updated"] = begin + record["loops"]["seconds"] + blocking * len(saves)
        record["last"]["t"] = record["updated"]
    if end:
        record["end"] = {"t": done + 1.0, "reason": end, "step": last_step}
    if death:
        record["previous_death"] = death
    if restart is not None:
        record["restart"] = restart
    return record


def account(records: list[dict]) -> report.Report:
    """The report of run records' accounts, given as their JSON."""
    return arithmetic.account([from_json(r) for r in records])


def total(r: report.Report) -> float:
    return r.goodput_s + sum(r.badput_s.values())


def test_an_uninterrupted_run_splits_its_wall_time_exactly():
    r = account(
        [process(1000.0, 0, 1000, saves=(500, 1000), input_seconds=3.0, evaluations=(4.0,))]
    )
    assert r.wall_s == pytest.approx(5 + 10 + 2 + 3 + 0.2 + 4 + 1)
    assert total(r) == pytest.approx(r.wall_s)
    assert r.goodput_s == pytest.approx(1000 * STEP)
    assert r.badput_s["startup"] == pytest.approx(5)
    assert r.badput_s["compile"] == pytest.approx(2)
    assert r.badput_s["input_wait"] == pytest.approx(3)
    assert r.badput_s["checkpoint"] == pytest.approx(0.2)
    assert r.badput_s["evaluation"] == pytest.approx(4)
    assert r.badput_s["other"] == pytest.approx(1)  # the end of the process
    assert r.badput_s["lost_progress"] == r.badput_s["downtime"] == 0
    assert (r.disruptions, r.restarts, r.steps, r.processes) == (0, 0, 1000, 1)
    assert r.step_seconds == pytest.approx(STEP)


def test_two_kills_under_the_supervisor_count_lost_progress_and_downtime():
    # Killed at step 340 (record last written at 330; saves 100..300), restarted 3 s later
    # from ckpt-300; killed at 780 (record at 780), restarted from 700; then finishes.
    first = process(0.0, 0, 340, saves=(100, 200, 300), end=None, updated_step=330)
    death1 = first["updated"] + 0.25  # the supervisor's clock: 0.1 s of steps after the record
    second = process(
        death1 + 3.0,
        300,
        780,
        saves=(400, 500, 600, 700),
        end=None,
        updated_step=780,
        death={"t": 0.0, "cause": "killed by SIGKILL"},
        restart=1,
    )
    second["previous_death"]["t"] = death1
    death2 = second["updated"] + 0.05
    third = process(
        death2 + 2.0,
        700,
        1000,
        saves=(800, 900, 1000),
        death={"t": death2, "cause": "killed by SIGKILL"},
        restart=2,
    )
    r = account([third, first, second])  # any order: sorted by start
    assert (r.disruptions, r.restarts, r.processes, r.steps) == (2, 2, 3, 1000)
    # 30 steps recorded past ckpt-300 + 0.25 s after the record; 80 past ckpt-700 + 0.05 s.
    assert r.badput_s["lost_progress"] == pytest.approx(30 * STEP + 0.25 + 80 * STEP + 0.05)
    assert r.badput_s["downtime"] == pytest.approx(3.0 + 2.0)
    assert r.badput_s["startup"] == pytest.approx(15)
    assert r.badput_s["compile"] == pytest.approx(6)
    assert r.goodput_s == pytest.approx(1000 * STEP)
    assert r.wall_s == pytest.approx(third["end"]["t"])
    assert total(r) == pytest.approx(r.wall_s)


def test_a_run_rerun_by_hand_after_a_kill_counts_the_unseen_tail_as_downtime():
    first = process(0.0, 0, 340, saves=(100, 200, 300), end=None, updated_step=330)
    second = process(first["updated"] + 10.0, 300, 500, saves=(400, 500))
    r = account([first, second])
    assert r.badput_s["lost_progress"] == pytest.approx(30 * STEP)
    assert r.badput_s["downtime"] == pytest.approx(10.0)
    assert (r.disruptions, r.restarts) == (1, 0)
    assert total(r) == pytest.approx(r.wall_s)


def test_a_sigterm_stop_keeps_its_steps_and_a_last_death_loses_those_after_its_save():
    stopped = process(0.0, 0, 250, saves=(100, 200, 250), end="preempted")
    resumed = process(
        stopped["end"]["t"] + 1, 250, 420, saves=(300, 400), end=None, updated_step=420
    )
    r = account([stopped, resumed])
    assert r.steps == 250 + 150  # the last process's 20 steps after ckpt-400 are lost
    assert r.badput_s["lost_progress"] == pytest.approx(20 * STEP)
    assert r.disruptions == 2  # the stop, and the death nothing resumed
    assert total(r) == pytest.approx(r.wall_s)


def test_a_process_killed_before_its_first_step_is_all_startup():
    early = {"process_start": 0.0, "updated": 0.5}
    later = process(4.0, 0, 100, death={"t": 1.0, "cause": "killed by SIGKILL"}, restart=1)
    r = account([early, later])
    assert r.badput_s["startup"] == pytest.approx(1.0 + 5.0)
    assert r.badput_s["downtime"] == pytest.approx(3.0)
    assert total(r) == pytest.approx(r.wall_s)


def test_mfu_is_the_achieved_flops_over_the_peak_and_null_without_one():
    record = process(0.0, 0, 1000)
    record["model_flops_per_step"] = 1e9
    cpu = account([{**record, "peak_flops_per_s": None, "peak_why": "a CPU has no peak"}])
    assert cpu.achieved_flops_per_s == pytest.approx(1e9 / STEP)
    assert cpu.mfu is None and cpu.mfu_why == "a CPU has no peak"
    tpu = account([{**record, "peak_flops_per_s": 1e12}])
    assert tpu.mfu == pytest.approx(1e9 / STEP / 1e12)
    assert "MFU 10.0%" in report.summary_line(tpu)


def test_the_summary_line_names_the_largest_badput():
    r = account([process(0.0, 0, 1000, startup=30.0)])
    line = report.summary_line(r)
    assert line.startswith(f"goodput {r.goodput_share:.1%} of ")
    assert "largest badput startup 30.00 s" in line and "MFU n/a" in line


def write_records(model_dir, *accounts: dict) -> None:
    runs = model_dir / "runs"
    runs.mkdir(parents=True)
    for i, goodput in enumerate(accounts):
        name = f"20261126T1200{i:02d}.000000Z-train.json"
        (runs / name).write_text(json.dumps({"run_config": {}, "goodput": goodput}))
    (runs / "20261126T130000.000000Z-eval.json").write_text("{}")  # not a train: ignored


def test_report_command_prints_the_table_and_the_json(tpurun_cli, tmp_path):
    write_records(tmp_path, process(0.0, 0, 340, saves=(300,), end=None), process(40.0, 300, 500))
    result = assert_ok(tpurun_cli("report", f"--model_dir={tmp_path}", "--json"))
    data = json.loads(result.stdout)
    assert set(data) == {
        "wall_s",
        "goodput_s",
        "badput_s",
        "disruptions",
        "restarts",
        "steps",
        "model_flops_per_step",
        "achieved_flops_per_s",
        "mfu",
        "resume",
        "skipped_records",
    }
    assert data["skipped_records"] == []
    assert set(data["badput_s"]) == set(CATEGORIES)
    assert data["disruptions"] == 1 and data["steps"] == 500
    assert data["goodput_s"] + sum(data["badput_s"].values()) == pytest.approx(data["wall_s"])
    table = assert_ok(tpurun_cli("report", f"--model_dir={tmp_path}")).stdout
    assert table.splitlines()[0].startswith("wall time") and "lost_progress" in table


def test_the_table_says_whether_the_newest_process_resumes_bit_identically(tpurun_cli, tmp_path):
    first, second = process(0.0, 0, 340, saves=(300,), end=None), process(40.0, 300, 500)
    first["resume"] = {"bit_identical": False, "reason": "the CPU's kernels"}
    second["resume"] = {"bit_identical": True, "deterministic": True, "reason": "deterministic"}
    write_records(tmp_path, first, second)
    table = assert_ok(tpurun_cli("report", f"--model_dir={tmp_path}")).stdout
    assert table.splitlines()[-1] == "resumes        are bit-identical: deterministic"
    del second["resume"]  # a record written before records kept it: the older one's
    write_records(tmp_path / "older", first, second)
    data = json.loads(report.main(str(tmp_path / "older"), as_json=True))
    assert data["resume"] == (
        "continue the same run but may differ in the last bits: the CPU's kernels"
    )


def test_report_of_a_model_dir_without_records_is_one_line(tpurun_cli, tmp_path):
    assert_fails(tpurun_cli("report", f"--model_dir={tmp_path}"), 1, "no train run record")
    assert_fails(tpurun_cli("report", f"--model_dir={tmp_path}", "--train_steps=3"), 2, "drop it")
    assert_fails(tpurun_cli("report"), 2, "needs --model_dir")


def test_the_peak_is_the_tpu_tables_and_a_cpu_has_none():
    import tensorflow as tf

    from tpurun.check import peak_flops, targets
    from tpurun.cluster import Cluster

    default = tf.distribute.get_strategy()
    tpu = Cluster(default, "TPU 'spot' (v5litepod-8, TensorFlow 2.21.0)", is_tpu=True)
    v5e = next(g for g in targets.GENERATIONS if g.name == "v5e")
    assert peak_flops(tpu) == (v5e.peak_flops_per_replica, None)  # one replica here
    v2 = Cluster(default, "TPU 'old' (v2-8, TensorFlow 2.21.0)", is_tpu=True)
    assert peak_flops(v2)[0] is None and "publishes no peak" in peak_flops(v2)[1]
    assert peak_flops(Cluster(default, "1 CPU")) == (None, "a CPU has no peak FLOP/s table")


def test_the_supervisors_last_step_ends_a_killed_process_and_the_rest_is_downtime():
    first = process(0.0, 0, 340, saves=(100, 200, 300), end=None, updated_step=330)
    # The pipe said step 340 was reached 0.1 s after the record; it died 0.3 s later.
    reached = first["updated"] + 0.1
    death = {"t": reached + 0.3, "cause": "killed by SIGKILL", "step": 340, "step_t": reached}
    second = process(reached + 2.0, 300, 500, saves=(400, 500), death=death, restart=1)
    r = account([first, second])
    assert r.badput_s["lost_progress"] == pytest.approx(30 * STEP + 0.1)
    assert r.badput_s["downtime"] == pytest.approx(2.0)
    assert total(r) == pytest.approx(r.wall_s)


def test_a_killed_process_loses_its_time_since_the_resumed_step_by_the_clock():
    first = process(0.0, 0, 340, saves=(100, 200, 300), end=None, updated_step=330)
    reached_300 = 100.0  # when its loop reached step 300 (the save says so)
    first["saves"][-1]["reached_t"] = reached_300
    first["saves"].append({"step": 310, "t": reached_300 + 0.5, "blocking_s": 0.2})
    first["updated"] = reached_300 + 1.0
    first["evaluations"] = [{"step": 300, "t": reached_300 + 0.6, "seconds": 0.3}]
    death = {"t": 0.0, "cause": "killed by SIGKILL", "step": 345, "step_t": reached_300 + 1.5}
    death["t"] = death["step_t"] + 0.2
    second = process(death["t"] + 2.0, 300, 500, saves=(400, 500), death=death, restart=1)
    r = account([first, second])
    # 1.5 s since step 300, less the save's 0.2 s and the evaluation's 0.3 s after it.
    assert r.badput_s["lost_progress"] == pytest.approx(1.5 - 0.2 - 0.3)
    assert r.badput_s["downtime"] == pytest.approx(2.2)
    assert total(r) == pytest.approx(r.wall_s)


def test_steps_past_the_records_last_write_count_when_the_next_trainer_resumed_there():
    # Its record was last written at step 100; it saved ckpt-150 (unrecorded) and the
    # supervisor heard of step 160; the next trainer resumed from 150.
    first = process(0.0, 0, 160, saves=(50, 100), end=None, updated_step=100)
    death = {"t": 0.0, "cause": "killed by SIGKILL", "step": 160}
    death["step_t"] = first["updated"] + 60 * STEP
    death["t"] = death["step_t"] + 0.1
    second = process(death["t"] + 2.0, 150, 300, saves=(200, 300), death=death, restart=1)
    r = account([first, second])
    assert r.steps == 300
    assert r.goodput_s == pytest.approx(300 * STEP)
    assert r.badput_s["lost_progress"] == pytest.approx(10 * STEP)
    assert total(r) == pytest.approx(r.wall_s)


# --- Records that do not hold: skipped with one line naming the file and the field -------

GOOD = (process(0.0, 0, 340, saves=(300,), end=None), process(40.0, 300, 500))
HOSTILE_NAME = "20261126T125959.000000Z-train.json"


def _with(change) -> bytes:
    """A third process's record (after the good ones), changed by `change(goodput)`."""
    goodput = process(100.0, 500, 600)
    change(goodput)
    return json.dumps({"run_config": {}, "goodput": goodput}).encode()


def _served(field) -> bytes:
    """A third process's record (after the good ones) whose input a tf.data service made,
    its `data_service` field `field` (tpurun.layout.served_input)."""
    served = {"service": "grpc://h:1", "processing_mode": "distributed_epoch", "job_name": "j"}
    record = {"goodput": process(100.0, 500, 600), "data_service": {**served, **field}}
    return json.dumps(record).encode()


def _set(path: str, value):
    def change(goodput: dict) -> None:
        *parents, key = path.split(".")
        for parent in parents:
            goodput = goodput[parent]
        goodput[key] = value

    return change


HOSTILE = {
    "goodput is a list": (json.dumps({"goodput": [1, 2]}).encode(), "goodput is a list"),
    "saves is an object": (_with(_set("saves", {"step": 1})), "goodput.saves is an object"),
    "a text for a time": (_with(_set("process_start", "noon")), "goodput.process_start is a text"),
    "a fraction for a step": (
        _with(_set("training_start.step", 1.5)),
        "goodput.training_start.step is 1.5",
    ),
    "a negative time": (_with(_set("process_start", -5.0)), "goodput.process_start is -5.0"),
    "an end before the start": (_with(_set("end.t", 50.0)), "goodput.end.t is 50.0, before"),
    "NaN": (_with(_set("end.t", float("nan"))), "goodput.end.t is nan"),
    "infinity": (_with(_set("updated", float("inf"))), "goodput.updated is inf"),
    "1.7e308": (_with(_set("end.t", 1.7e308)), "goodput.end.t is 1.7e+308"),
    # An integer that no float holds: counted, it would end the report in OverflowError.
    "10**400": (_with(_set("end.t", 10**400)), "goodput.end.t is an integer of 401 digits"),
    "10**400 FLOPs": (
        _with(_set("model_flops_per_step", 10**400)),
        "goodput.model_flops_per_step is an integer of 401 digits",
    ),
    "a number past Python's digits": (
        b'{"goodput": {"process_start": ' + b"9" * 5000 + b"}}",
        "holds a number too long to read, not a record",
    ),
    "loops longer than the process": (_with(_set("loops.seconds", 1e6)), "goodput.loops.seconds"),
    "a save outside the process": (
        _with(lambda g: g["saves"].append({"step": 7, "t": 1e9, "blocking_s": 0.0})),
        "goodput.saves[0].t is 1000000000.0, outside",
    ),
    "deep nesting": (b'{"goodput": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    "not UTF-8": (
        b'{"goodput": {"process_start": "\xff\xfe"}}',
        "not UTF-8 text (byte 31 is 0xff)",
    ),
    "a link to a directory": (None, "is a directory, not a record"),
    # Its data_service field (a tf.data service made its input) is checked too.
    "a data_service step that is a text": (
        _served({"started_at_step": "500"}),
        "data_service.started_at_step is a text, not a step",
    ),
    "a data_service epoch that is negative": (
        _served({"started_at_step": 500, "input_starts_at": {"epoch": -1, "step": 480.0}}),
        "data_service.input_starts_at.epoch is -1, not a step",
    ),
    "a verdict that is no boolean": (
        _with(_set("resume", {"bit_identical": "yes"})),
        "goodput.resume.bit_identical is a text, not true or false",
    ),
}


def _place(runs: Path, name: str, case: str) -> Path:
    """The record of HOSTILE[case] as runs/<name>."""
    content = HOSTILE[case][0]
    path = runs / name
    if content is None:
        (runs.parent / f"elsewhere-{name}").mkdir()
        path.symlink_to(runs.parent / f"elsewhere-{name}")
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", HOSTILE)
def test_a_record_that_does_not_hold_is_skipped_naming_its_file_and_field(tmp_path, capsys, case):
    """The rule, case by case (`report.main`, the command's body); the test below puts them
    all in one model_dir through the CLI."""
    write_records(tmp_path, *GOOD)
    hostile = _place(tmp_path / "runs", HOSTILE_NAME, case)
    data = json.loads(report.main(str(tmp_path), as_json=True))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tpurun report: skipped {hostile}") and HOSTILE[case][1] in line, line
    assert len(line) < 400
    assert data.pop("skipped_records") == [line.removeprefix("tpurun report: skipped ")]
    assert data == account(list(GOOD)).as_json()  # the good records' report, as without it


def test_every_hostile_record_at_once_through_the_cli(tpurun_cli, tmp_path):
    write_records(tmp_path, *GOOD)
    for i, case in enumerate(HOSTILE):
        _place(tmp_path / "runs", f"20261126T1300{i:02d}.000000Z-train.json", case)
    result = assert_ok(tpurun_cli("report", f"--model_dir={tmp_path}", "--json"))
    skipped = result.stderr.splitlines()
    assert len(skipped) == len(HOSTILE) and all("tpurun report: skipped " in x for x in skipped)
    data = json.loads(result.stdout)
    assert len(data.pop("skipped_records")) == len(HOSTILE)
    assert data == account(list(GOOD)).as_json()


def test_a_model_dir_or_runs_that_is_a_file_and_only_bad_records_are_one_line(tpurun_cli, tmp_path):
    (tmp_path / "file").write_text("x")
    assert_fails(tpurun_cli("report", f"--model_dir={tmp_path / 'file'}"), 1, "is a file")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "runs").write_text("x")
    assert_fails(tpurun_cli("report", f"--model_dir={tmp_path / 'model'}"), 1, "runs is a file")
    write_records(tmp_path / "bad", {"process_start": "noon"})
    result = tpurun_cli("report", f"--model_dir={tmp_path / 'bad'}")
    assert result.returncode == 1 and "(1 skipped: see above)" in error_lines(result)[0]
    assert "goodput.process_start is a text" in result.stderr


def test_figures_stay_within_physical_bounds_when_records_overlap_or_estimates_overshoot():
    # A trainer whose recorded end is after the next one's start (a --force_takeover of a
    # hung trainer); a first loop slower than the steady step time says; a FLOP count
    # giving more than the device's peak.
    hung = process(0.0, 0, 300, saves=(100, 200, 300), end="error")
    hung["end"]["t"] = 1000.0
    taker = process(20.0, 300, 400, saves=(400,), compile_s=50.0)
    taker["first_loop"]["seconds"] = taker["loops"]["seconds"]
    r = account([hung, taker])
    assert min(r.badput_s.values()) >= 0 and r.goodput_s >= 0
    assert total(r) == pytest.approx(r.wall_s) and 0 <= r.goodput_share <= 1
    assert r.wall_s == pytest.approx(taker["end"]["t"])
    fast = {**process(0.0, 0, 1000), "model_flops_per_step": 1e15, "peak_flops_per_s": 1e12}
    r = account([fast])
    assert r.mfu is None and "past 100%" in r.mfu_why
