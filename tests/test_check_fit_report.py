"""tpurun.check.fit_report: the memory table, the `memory` finding and its levers, the JSON.

Built from estimates made up here (no compile): what each row and each lever says,
for configs with and without the precision and accumulation keys.
"""

from __future__ import annotations

import pytest

from tpurun.check import fit_report, targets
from tpurun.check.findings import merge
from tpurun.check.memory import Array, MemoryEstimate
from tpurun.check.preflight import StepMemory, TargetMemory
from tpurun.model import Mode
from tpurun.run_config import RunConfig, config_files, merge_flags

V5E_8 = targets.parse("v5e-8")
GB = 10**9


def run_config(**keys) -> RunConfig:
    """mnist's RunConfig for `tpurun check`, with config keys set (`train__accumulate_steps`)."""
    config = config_files.load(config_files.resolve("mnist"))
    with config.unlocked():
        for dotted, value in keys.items():
            section, _, leaf = dotted.rpartition("__")
            (config[section] if section else config)[leaf] = value
    return RunConfig(
        command="check",
        config_name="mnist",
        config=merge_flags(config, {}),
        model_dir="unused",
        target="v5e-8",
    )


def step(mode: Mode, batch: int, per_example: int, max_batch: int | None = None) -> StepMemory:
    """A made-up estimate: 4 MB of float32 weights, `per_example` bytes of other per example."""
    weights = Array("weights", "dense/kernel", (1000, 1000), "float32", 4 * 10**6, 4 * 10**6)
    found = MemoryEstimate(arrays=(weights,), temporaries_bytes=batch * per_example)
    return StepMemory(mode, batch, found, V5E_8.hbm_bytes_per_replica, max_batch)


def too_big(run: RunConfig, max_batch: int | None = 1000) -> str:
    found = TargetMemory(V5E_8, (step(Mode.TRAIN, 4096, 10**7, max_batch),), {}, {})
    (finding,) = merge(fit_report.problems(run, found))
    return str(finding)


def test_a_fitting_job_shows_every_row_and_its_headroom():
    found = TargetMemory(
        V5E_8,
        (step(Mode.TRAIN, 128, 10**6), step(Mode.EVAL, 128, 10**5)),
        {Mode.PREDICT: "tpurun predict runs X.generate(), not the predict step"},
        {},
    )
    text = "\n".join(fit_report.table(found, iterations=50))
    assert text.startswith("Memory per replica on a v5litepod-8: 8 replicas with 16 GB of HBM")
    for row in ("batch per replica", "weights", "optimizer state", "input (2 batches)", "other"):
        assert f"\n  {row} " in text
    assert "total" in text and "HBM per replica" in text
    assert "15.87 GB (99.1%)" in text  # 16 GB - 4 MB - 128 MB, rounded down
    assert "largest batch that fits" not in text  # nothing to search: everything fits
    assert "predict: tpurun predict runs X.generate()" in text
    assert "--iterations=50" in text and "re-uses the step's buffers" in text
    assert fit_report.problems(run_config(), found) == []


def test_a_step_that_does_not_fit_is_one_error_line_with_the_batch_that_does():
    line = too_big(run_config())
    assert line.startswith(
        "[memory] error: the train step needs 41 GB per replica at a per-replica batch of "
        "4096, and a v5litepod-8 replica has 16 GB (estimated from the compiled step). Fix: "
        "the largest per-replica batch that fits is 1000: --batch_size=8000 (8 replicas)"
    ), line
    # A v5litepod-32 splits 32768 into 1024 per replica: too many; a v5litepod-64 into 512.
    assert line.endswith(
        "or more replicas: a v5litepod-64 splits --batch_size=32768 into 512 per replica"
    )
    assert "\n" not in line


def test_bfloat16_and_accumulation_keep_the_batch():
    line = too_big(run_config())
    assert "; or bfloat16 activations: --precision=mixed_bfloat16; " in line
    # 4096 per replica in 8 micro-batches of 512: the same 32768 examples per update.
    assert (
        "; or gradient accumulation: --batch_size=4096 --config.train.accumulate_steps=8 keeps "
        "32768 examples per update; "
    ) in line


def test_accumulation_already_on_is_raised_to_what_fits():
    line = too_big(run_config(train__accumulate_steps=2))
    # 2 x 4096 = 8192 per replica per update: 16 micro-batches of 512 (8 of 1024 do not fit).
    assert "--batch_size=4096 --config.train.accumulate_steps=16 keeps 65536 examples" in line


def test_bfloat16_is_not_offered_when_it_is_already_on():
    assert "precision" not in too_big(run_config(precision="mixed_bfloat16"))


def test_when_nothing_fits_the_weights_alone_are_named_and_bigger_tpus():
    line = too_big(run_config(), max_batch=None)
    assert (
        "not even a per-replica batch of 1 fits: the weights and optimizer state alone take" in line
    )
    assert "a TPU with more HBM per replica: v3 with 17.2 GB (16 GiB), v4 with" in line
    assert "v5p with 102 GB (95 GiB)" in line and "v2 with" not in line


def test_an_estimate_that_failed_is_an_error():
    found = TargetMemory(V5E_8, (), {}, {Mode.EVAL: "the step does not compile with XLA: boom"})
    (finding,) = merge(fit_report.problems(run_config(), found))
    assert str(finding).startswith(
        "[memory] error: the memory of the eval step on a v5litepod-8 could not be estimated: "
        "the step does not compile with XLA: boom. Fix: "
    )


def test_the_json_report_has_the_documented_keys():
    found = TargetMemory(
        V5E_8, (step(Mode.TRAIN, 4096, 10**7, 1000), step(Mode.EVAL, 8, 10)), {}, {}
    )
    data = fit_report.report(run_config(), found)
    assert {"target", "replicas", "hbm_bytes_per_replica", "steps"} <= set(data)
    assert (data["target"], data["replicas"], data["hbm_bytes_per_replica"]) == (
        "v5litepod-8",
        8,
        16 * GB,
    )
    train = data["steps"]["train"]
    assert {
        "batch_per_replica",
        "weights_bytes",
        "optimizer_bytes",
        "input_bytes",
        "other_bytes",
        "total_bytes",
        "fits",
        "max_batch_per_replica",
    } <= set(train)
    assert (train["fits"], train["max_batch_per_replica"]) == (False, 1000)
    assert train["total_bytes"] == sum(
        train[k] for k in ("weights_bytes", "optimizer_bytes", "input_bytes", "other_bytes")
    )
    assert data["steps"]["eval"]["max_batch_per_replica"] is None  # fits: not searched


@pytest.mark.parametrize(
    "n, text", [(16 * GB, "16 GB"), (16 << 30, "17.2 GB (16 GiB)"), (95 << 30, "102 GB (95 GiB)")]
)
def test_hbm_is_given_in_the_docs_units_too(n, text):
    assert fit_report.hbm_text(n) == text
