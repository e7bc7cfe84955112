"""tpurun.check.report.fit_findings: the `memory` finding of a step that does not fit, and its levers.

Built from sizes made up here (no compile): what the line says for the XLA:CPU
estimate, the TPU compiler's total and its refusal, for configs with and without
the precision and accumulation keys, and when not even a batch of 1 fits.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_check_fit_report import V5E_8, refused, run_config, step

from tpurun.check.report import fit_findings
from tpurun.check.rules.findings import merge
from tpurun.check.sizing.batch_search import Found
from tpurun.check.sizing.preflight import TargetMemory
from tpurun.check.sizing.tpu_compiler import client
from tpurun.model import Mode

GIB = 1 << 30
SEARCHED = Found(1000, 1008, compiles=7, bound=11)


def too_big(run, search: Found | None = SEARCHED, **fields) -> str:
    found = TargetMemory(V5E_8, (step(Mode.TRAIN, 4096, 10**7, search),), {}, {}, **fields)
    (finding,) = merge(fit_findings.problems(run, found))
    return str(finding)


@pytest.fixture
def no_extra(monkeypatch):
    monkeypatch.setattr(client, "missing_extra", lambda: "jax")


def test_the_estimate_says_it_is_one_and_how_to_get_the_compilers(no_extra):
    line = too_big(run_config())
    assert line.startswith(
        "[memory] error: the train step needs 41 GB per replica at a per-replica batch of "
        "4096, and a v5litepod-8 replica has 16 GB (XLA:CPU's estimate, not the TPU "
        f"compiler's; {client.INSTALL} gives the compiler's). Fix: the largest per-replica "
        "batch found to fit is 1000 (the search's answer, not a proof: 1008 does not fit, a "
        "larger batch might) by that estimate: --batch_size=8000 (8 replicas)"
    ), line
    # A v5litepod-32 splits 32768 into 1024 per replica: too many; a v5litepod-64 into 512.
    assert line.endswith(
        "or more replicas: a v5litepod-64 splits --batch_size=32768 into 512 per replica"
    )
    assert "\n" not in line


def test_a_step_whose_compile_failed_says_so_instead():
    line = too_big(run_config(), fallbacks={Mode.TRAIN: "the TPU compiler failed: boom"})
    assert "(XLA:CPU's estimate: the TPU compile of this step failed (see the note))" in line


def test_the_compilers_refusal_is_its_own_words():
    search = Found(3456, 3464, compiles=8, bound=11)
    at_3600 = dataclasses.replace(step(Mode.TRAIN, 3600, 0, search), estimate=refused(17.5))
    found = TargetMemory(V5E_8, (at_3600,), {}, {})
    (finding,) = merge(fit_findings.problems(run_config(), found))
    assert str(finding).startswith(
        "[memory] error: the train step does not fit a v5litepod-8 replica at a per-replica "
        "batch of 3600: the TPU compiler refused it: its HLO temporaries need 18.8 GB, more "
        "than the 16.9 GB of HBM it has. Fix: the largest per-replica batch found to fit is "
        "3456 (the search's answer, not a proof: 3464 does not fit, a larger batch might): "
        "--batch_size=27648 (8 replicas)"
    ), finding


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


# The usable HBM per replica of each generation, as libtpu 0.0.52's compiler states it.
USABLE = {
    "v2": 8031588843,  # 7.48 GiB
    "v3": 16621523435,  # 15.48 GiB
    "v4": 33017561088,  # 30.75 GiB
    "v5e": 16911433728,  # 15.75 GiB
    "v5p": 102789304811,  # 95.73 GiB
    "v6e": 33543694581,  # 31.24 GiB
}


def nothing_fits(need_gib: float, **fields) -> str:
    at_1 = refused(need_gib)
    nothing = Found(None, 1, compiles=14, bound=14)
    train = dataclasses.replace(
        step(Mode.TRAIN, 4096, 0, nothing), estimate=refused(need_gib * 100), smallest=at_1
    )
    found = TargetMemory(V5E_8, (train,), {}, {}, usable_hbm=USABLE, **fields)
    (finding,) = merge(fit_findings.problems(run_config(), found))
    return str(finding)


def test_when_nothing_fits_only_tpus_that_hold_the_need_are_named():
    line = nothing_fits(20)  # 21.5 GB of temporaries at a batch of 1
    assert (
        "Fix: the TPU compiler refused even a per-replica batch of 1: its HLO temporaries need "
        "21.5 GB, more than the 16.9 GB of HBM it has; use a smaller model, or a TPU whose HBM "
        "per replica (as its TPU compiler counts it) exceeds the 21.5 GB its HLO temporaries "
        "need: v4 with 33 GB (30.75 GiB), v5p with 103 GB (95.73 GiB), v6e with 33.5 GB "
        "(31.24 GiB)"
    ) in line
    # v3's 17.2 GB (16 GiB) per core are 15.48 GiB to its compiler: no more than v5e's.
    assert "v3" not in line and "v2" not in line
    assert "weights and optimizer state" not in line  # the refusal does not say them


def test_when_no_tpu_holds_the_step_it_says_so():
    line = nothing_fits(156.5)  # 168 GB
    assert (
        "; use a smaller model; no TPU's HBM per replica (as its TPU compiler counts it) "
        "exceeds the 168 GB its HLO temporaries need: the most is v5p's 103 GB (95.73 GiB)"
    ) in line
    assert "or a TPU whose" not in line


def test_the_estimate_when_nothing_fits_is_named_with_the_docs_hbm(no_extra):
    nothing = Found(None, 1, compiles=14, bound=14)
    at_1 = step(Mode.TRAIN, 1, 41 * 10**9).estimate
    train = dataclasses.replace(step(Mode.TRAIN, 4096, 10**7, nothing), smallest=at_1)
    (finding,) = merge(fit_findings.problems(run_config(), TargetMemory(V5E_8, (train,), {}, {})))
    line = str(finding)
    assert "not even a per-replica batch of 1 fits: it needs 41 GB, the weights and optimizer " in (
        line
    )
    assert "state alone 4 MB (XLA:CPU's estimate, not the TPU compiler's; " in line
    assert "exceeds the 41 GB it needs: v5p with 102 GB (95 GiB)" in line
    assert "v3" not in line and "v4" not in line


def test_an_estimate_that_failed_is_an_error():
    found = TargetMemory(V5E_8, (), {}, {Mode.EVAL: "the step does not compile with XLA: boom"})
    (finding,) = merge(fit_findings.problems(run_config(), found))
    assert str(finding).startswith(
        "[memory] error: the memory of the eval step on a v5litepod-8 could not be estimated: "
        "the step does not compile with XLA: boom. Fix: "
    )
