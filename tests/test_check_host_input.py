"""tpurun.check.bounds.host_input: will the target's hosts keep its chips fed? Measured input, the verdict.

The verdict and the report from figures made up here (a measurement and a step
bound); the measurement itself on a small in-memory dataset, for a fraction of a
second. `tpurun check` prints them for mnist in tests/test_check_preflight.py
(measured) and for Iris in tests/test_check_tpu_compiler.py (device data: nothing
to measure).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tpurun.check import targets
from tpurun.check.bounds import host_input
from tpurun.check.bounds.host_input import HostInput, Measured
from tpurun.check.bounds.step_bounds import StepBound
from tpurun.model import Mode

V5E_8 = targets.parse("v5e-8")


def host(per_cpu_second: float, step_examples_per_second: float | None) -> HostInput:
    """A v5e-8 host (224 vCPUs) whose input makes `per_cpu_second` examples per CPU-second
    here, and a train step that takes at most `step_examples_per_second` (None: no bound)."""
    measured = Measured(
        examples=int(per_cpu_second * 4),
        seconds=2.0,
        cpu_seconds=4.0,
        cores=2,
        first_batch_seconds=0.3,
    )
    bound = None
    if step_examples_per_second is not None:
        seconds = 1024 / step_examples_per_second
        bound = StepBound(Mode.TRAIN, 1e9, 1e8, seconds, seconds / 2, examples=1024)
    return HostInput(
        V5E_8,
        measured=measured,
        vcpus=224,
        examples_per_host_step=1024,
        train_bound=bound,
        no_bound="" if bound else "its XLA:CPU estimate counts no FLOPs",
    )


def test_a_host_slower_than_the_step_is_input_bound_with_the_chips_wait_and_remedies():
    found = host(per_cpu_second=1000, step_examples_per_second=448_000)  # 224k vs 448k
    assert (found.host_rate, found.step_rate) == pytest.approx((224_000, 448_000))
    assert (found.ratio, found.chips_wait) == pytest.approx((0.5, 0.5))
    text = "\n".join(host_input.lines(found))
    assert (
        "  input-bound: a v5litepod-8 host (224 vCPUs, https://cloud.google.com/tpu/docs/v5e) "
        "makes at most ~224k examples/s, the train step could take 448k per host"
    ) in text
    assert "the chips would wait 50% of the time; remedies: more host vCPUs per chip" in text
    assert "  here: 2k examples/s on this machine's 2 cores (2.0 busy): 1k per CPU-second" in text
    assert text.splitlines()[-1] == f"  assumptions: {host_input.ASSUMPTIONS}"
    data = host_input.report(found)
    assert data["input_bound"] is True and data["chips_wait_fraction"] == pytest.approx(0.5)
    assert (data["host_vcpus"], data["hosts"], data["examples_per_host_step"]) == (224, 1, 1024)


def test_a_host_faster_than_the_step_keeps_up_by_how_much():
    found = host(per_cpu_second=1000, step_examples_per_second=56_000)
    assert (found.ratio, found.chips_wait) == pytest.approx((4.0, 0.0))
    (verdict,) = [line for line in host_input.lines(found) if "keeps up" in line]
    assert "~224k examples/s, 4.0x the 56k per host that the train step takes" in verdict
    assert host_input.report(found)["input_bound"] is False


def test_without_a_step_bound_the_host_figure_is_given_and_why_nothing_compares():
    found = host(per_cpu_second=1000, step_examples_per_second=None)
    (line,) = [line for line in host_input.lines(found) if "vCPUs" in line]
    assert line.endswith(
        "makes at most ~224k examples/s; no train step time to compare with: its XLA:CPU "
        "estimate counts no FLOPs"
    )
    data = host_input.report(found)
    assert data["input_bound"] is None
    assert data["host_examples_per_second"] == pytest.approx(224_000)


def test_nothing_measured_is_one_line_and_says_why():
    found = host_input.skipped(V5E_8)
    assert host_input.lines(found) == ["Input: not measured (--input_check=false)"]
    assert host_input.report(found) == {
        "measured": False,
        "why_not": "not measured (--input_check=false)",
    }


def test_the_measurement_counts_the_batches_it_pulled_after_a_warm_up():
    rows = tf.data.Dataset.from_tensor_slices(np.arange(4096, dtype=np.float32)).repeat()
    batches = rows.batch(16, drop_remainder=True).map(lambda x: tf.sqrt(x) + 1)
    found = host_input.measure(batches, batch_size=16, seconds=0.2, warmup=0.1)
    assert found.examples > 0 and found.examples % 16 == 0
    assert 0.2 <= found.seconds < 5 and found.cpu_seconds > 0
    assert found.first_batch_seconds > 0 and found.cores >= 1
    assert found.examples_per_second == pytest.approx(found.examples / found.seconds)


@pytest.mark.parametrize(
    ("busy", "idle", "says"),
    [
        (1.9, 0.0, None),
        (0.9, 1.0, "0.9 of this machine's 2 cores busy and 1.0 stayed idle: a serial stage"),
        (0.9, 0.1, "0.9 of this machine's 2 cores busy: other processes used the rest"),
    ],
    ids=["all-busy", "serial-stage", "machine-shared"],
)
def test_cores_the_input_left_are_told_apart_from_cores_others_took(busy, idle, says):
    measured = Measured(1000, 2.0, busy * 2.0, cores=2, first_batch_seconds=0.1, idle_cores=idle)
    found = dataclasses.replace(host(1000, None), measured=measured)
    notes = [line for line in host_input.lines(found) if line.startswith("  note: ")]
    assert len(notes) == (1 if says else 0)
    assert not says or notes[0].startswith(f"  note: the input kept {says}")
