"""tpurun.check.report.fit_report: the memory table and the `--report` JSON.

Built from sizes made up here (no compile): what each row says, for the XLA:CPU
estimate and for a step the TPU compiler refused (its own figures, or "not known").
"""

from __future__ import annotations

import pytest

from tpurun.check import targets
from tpurun.check.report import fit_findings, fit_report
from tpurun.check.sizing.batch_search import Found
from tpurun.check.sizing.memory import Array, MemoryEstimate
from tpurun.check.sizing.preflight import StepMemory, TargetMemory
from tpurun.check.sizing.tpu_compiler.sizing import RefusedStep
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


def step(mode: Mode, batch: int, per_example: int, search: Found | None = None) -> StepMemory:
    """A made-up estimate: 4 MB of float32 weights, `per_example` bytes of other per example."""
    weights = Array("weights", "dense/kernel", (1000, 1000), "float32", 4 * 10**6, 4 * 10**6)
    found = MemoryEstimate(arrays=(weights,), temporaries_bytes=batch * per_example)
    return StepMemory(mode, batch, found, V5E_8.hbm_bytes_per_replica, search)


def refused(temporaries_gib: float) -> RefusedStep:
    """A v5e compiler's refusal before compiling: its planned temporaries, in GiB."""
    needed = int(temporaries_gib * (1 << 30))
    return RefusedStep(
        what="HLO temporaries",
        needed_bytes=needed,
        available_bytes=int(15.75 * (1 << 30)),
        message=f"RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: ... ({temporaries_gib}G) ...",
    )


def refused_train(batch: int = 3600) -> StepMemory:
    """The train step refused at `batch` per replica, searched down to 3456."""
    return StepMemory(
        Mode.TRAIN,
        batch,
        refused(17.5),
        int(15.75 * (1 << 30)),
        search=Found(3456, 3464, compiles=8, bound=11),
    )


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
    assert "largest batch found to fit" not in text  # nothing to search: everything fits
    assert "predict: tpurun predict runs X.generate()" in text
    assert "--iterations=50" in text and "re-uses the step's buffers" in text
    assert fit_findings.problems(run_config(), found) == []


def test_a_refused_step_shows_only_what_the_compiler_said():
    found = TargetMemory(V5E_8, (refused_train(), step(Mode.EVAL, 128, 10**5)), {}, {})
    lines = fit_report.table(found, iterations=1)
    columns = {line[2:34].strip(): line[34:].split("  ") for line in lines[2:] if line[2] != "n"}
    rows = {label: [v.strip() for v in values if v.strip()] for label, values in columns.items()}
    for label in ("weights", "optimizer state", "input (2 batches)", "outputs", "total"):
        assert rows[label][0] == "not known", label  # the refusal gave no figure for it
    assert rows["weights"][1] == "4 MB" and rows["outputs"] == ["not known"]  # eval: none
    assert rows["temporaries"] == ["18.8 GB"]  # 17.5 GiB: what the refusal said
    assert rows["headroom"][0] == "refused by the compiler"
    assert rows["largest batch found to fit"] == ["3456", "-"]
    text = "\n".join(lines)
    assert (
        "note: train at 3600 per replica: refused by the TPU compiler, whose refusal states "
        "only what it planned for the HLO temporaries, before it would recompute activations "
        "to save memory; the rows 'not known' are figures it gives only for a program it "
        "compiles"
    ) in text
    assert (
        "note: largest batch found to fit: by compiling the step at a few batches (train 8 "
        "of at most 11, at most ceil(log2(batch / 8)) + 2); a batch that compiled and fits, "
        "next to a larger one that does not."
    ) in text
    assert "a still larger batch may fit" in text


def test_a_refused_steps_report_has_no_figure_it_did_not_give():
    found = TargetMemory(V5E_8, (refused_train(),), {}, {})
    train = fit_report.report(run_config(), found)["steps"]["train"]
    assert train["temporary_bytes"] == int(17.5 * (1 << 30))
    for key in ("weights_bytes", "optimizer_bytes", "input_bytes", "total_bytes", "code_bytes"):
        assert train[key] is None, key
    assert train["refused"].startswith("the TPU compiler refused it: its HLO temporaries need")
    assert train["max_batch_per_replica"] == 3456
    assert train["batch_search"] == {"refused_above": 3464, "compiles": 8, "compile_bound": 11}


def test_the_json_report_has_the_documented_keys():
    searched = step(Mode.TRAIN, 4096, 10**7, Found(1000, 1008, compiles=5, bound=11))
    found = TargetMemory(V5E_8, (searched, step(Mode.EVAL, 8, 10)), {}, {})
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
