"""tpurun.check.sizing.batch_search: the largest batch that fits, within its stated number of compiles.

Pure Python: the step's size is a stand-in function of the batch, no compile. The
ConvMixer stand-in is shaped like the TPU compiler's answers for keras-io's
ConvMixer on a v5e (issue 40): memory grows linearly with the batch until the
compiler starts recomputing activations, then flattens below the HBM (FLOPs a
third above linear), a couple of larger batches fit beyond a refused one, and a
refused batch has no total (the compiler's refusal states its planned temporaries
only, without the arguments).
"""

from __future__ import annotations

import math
import random

import pytest

from tpurun.check.sizing import batch_search
from tpurun.check.sizing.batch_search import EXTRA_PROBES, Outcome, compile_bound, largest_batch

HBM = int(15.75 * (1 << 30))  # a v5e replica, as its compiler counts it
STATE = 7_190_000  # weights and optimizer state: ConvMixer-256/8 with AdamW
PER_EXAMPLE = 4_700_000  # bytes per example, before the compiler recomputes
EDGE = 3456  # the largest batch the stand-in's compiler fits below its first refusal
BEYOND = frozenset({3504, 3528})  # larger batches that fit too


def convmixer(batch: int) -> Outcome:
    """The stand-in: linear to 80% of the HBM, then flat (recomputed activations)."""
    linear = STATE + PER_EXAMPLE * batch
    knee = 0.8 * HBM
    if batch <= EDGE or batch in BEYOND:
        held = linear if linear <= knee else knee + 0.1 * (linear - knee)
        return Outcome(True, int(held))
    return Outcome(False, None)  # refused: the compiler gives no total


def convmixer_measured(batch: int) -> Outcome:
    """As the TPU compiler sized a ConvMixer-256/8 (AdamW, 32x32x3) on a v5e here: the
    same 15.7-15.9 GB from 1,800 to 3,464 per replica (it recomputes activations the
    more, the larger the batch), refused from 3,472."""
    if batch <= 1700:
        return Outcome(True, STATE + 9_300_000 * batch)
    if batch <= 3464:
        return Outcome(True, 15_700_000_000 + (batch * 7919 % 200) * 1_000_000)
    return Outcome(False, None)


class Counted:
    """A probe that records each batch it is asked for (a compile each)."""

    def __init__(self, size):
        self.size = size
        self.batches: list[int] = []

    def __call__(self, batch: int) -> Outcome:
        self.batches.append(batch)
        return self.size(batch)


def search(size, refused: int, **kwargs) -> tuple[batch_search.Found, list[int]]:
    probe = Counted(size)
    known = {refused: size(refused)}  # the step at the user's batch: compiled already
    found = largest_batch(probe, HBM, refused, known=known, log=lambda line: None, **kwargs)
    return found, probe.batches


def test_the_bound_is_a_bisections_count_and_two():
    assert compile_bound(8192) == math.ceil(math.log2(8192 / 8)) + EXTRA_PROBES == 12
    assert compile_bound(3600) == math.ceil(math.log2(3600 / 8)) + EXTRA_PROBES == 11
    assert compile_bound(3600, smallest=True) == 11 + 3  # and 1..7 when 8 does not fit
    assert compile_bound(8) == 0 and compile_bound(8, smallest=True) == 3


@pytest.mark.parametrize("refused", [3464, 3600, 4096, 8192, 65536, 1 << 20, 1 << 24])
def test_a_flat_non_monotonic_edge_is_searched_within_the_bound(refused):
    found, probed = search(convmixer, refused)
    assert found.compiles == len(probed) <= found.bound == compile_bound(refused)
    assert len(set(probed)) == len(probed) and refused not in probed  # no compile twice
    # A batch that compiled and fits, next to a larger one that compiled and does not.
    assert found.batch is not None and found.batch % 8 == 0
    assert convmixer(found.batch).fits and found.batch in {*probed, refused}
    assert not convmixer(found.refused_above).fits and found.batch < found.refused_above
    assert found.refused_above <= refused
    # The edge of this stand-in, or one of the larger batches that fit beyond it.
    assert found.batch in (EDGE, *BEYOND)


@pytest.mark.parametrize("refused", [3480, 3600, 8192, 65536, 1 << 20])
def test_the_measured_convmixer_takes_a_bisections_count_and_one(refused):
    """Its memory is flat for 1,700 batches below the edge: no line finds the edge, and
    one guess is spent before the search falls back to halving."""
    found, probed = search(convmixer_measured, refused)
    assert (found.batch, found.refused_above) == (3464, 3472)
    assert found.compiles <= compile_bound(refused) - EXTRA_PROBES + 1, probed


def test_from_3600_the_flat_edge_is_not_walked_one_multiple_at_a_time():
    """Issue 40 measured 21 compiles from 3600, 16 of them one multiple of 8 apart. The
    bound keeps any search to ceil(log2(3600 / 8)) + 2 = 11."""
    found, probed = search(convmixer, 3600)
    steps_of_8 = sum(1 for a, b in zip(probed, probed[1:], strict=False) if abs(a - b) == 8)
    assert found.compiles <= 11 and steps_of_8 <= 3


def linear(batch: int) -> Outcome:
    """Memory exactly linear in the batch (XLA:CPU's estimate is nearly so)."""
    total = STATE + PER_EXAMPLE * batch
    return Outcome(total <= HBM, total)


@pytest.mark.parametrize("refused", [4096, 8192, 65536, 1 << 22])
def test_a_linear_step_takes_a_few_compiles_to_its_exact_edge(refused):
    found, probed = search(linear, refused)
    edge = (HBM - STATE) // PER_EXAMPLE // 8 * 8
    assert found.batch == edge and found.refused_above == edge + 8
    assert found.compiles <= 5, probed  # the guesses, not the bound, set the pace here


def test_a_batch_in_the_millions_is_found_within_a_thousandth():
    per_example = 1000

    def small(batch: int) -> Outcome:
        return Outcome(batch * per_example <= HBM, batch * per_example)

    found, _ = search(small, 1 << 26)
    edge = HBM // per_example
    assert edge * (1 - 1 / batch_search.RESOLUTION) <= found.batch <= edge
    assert found.compiles <= compile_bound(1 << 26)


def test_below_8_only_when_8_does_not_fit():
    def tiny(batch: int) -> Outcome:
        return Outcome(batch <= 5, batch * HBM // 5)

    found, probed = search(tiny, 4096)
    assert (found.batch, found.refused_above) == (5, 6)
    assert found.compiles <= compile_bound(4096, smallest=True) == found.bound
    assert [b for b in probed if b < 8] and 8 in probed


def test_nothing_fits_not_even_a_batch_of_1():
    found, probed = search(lambda batch: Outcome(False, None), 3600)
    assert (found.batch, found.refused_above) == (None, 1) and 1 in probed
    assert found.compiles <= found.bound == compile_bound(3600, smallest=True)


def test_a_refused_batch_of_1_needs_no_search():
    found, probed = search(lambda batch: Outcome(False, None), 1)
    assert (found.batch, found.compiles, probed) == (None, 0, [])


def test_sizes_compiled_already_narrow_the_search_for_free():
    known = {b: convmixer(b) for b in (3600, 3448, 3456, 3464)}
    probe = Counted(convmixer)
    found = largest_batch(probe, HBM, 3600, known=known, log=lambda line: None)
    assert (found.batch, found.refused_above, probe.batches) == (3456, 3464, [])


@pytest.mark.parametrize("seed", range(40))
def test_the_bound_holds_whatever_the_sizes_are(seed):
    """Random answers, fit or not at each batch, with random figures: any search stays
    within its bound, and answers a batch that fits next to one that does not."""
    rng = random.Random(seed)
    refused = rng.choice([9, 100, 1000, 3600, 8192, 50_000])
    edge = rng.randrange(0, refused)
    noise = rng.random() * 0.2

    def erratic(batch: int) -> Outcome:
        fits = batch <= edge if rng.random() > noise else rng.random() < 0.5
        return Outcome(fits, rng.choice([None, int(rng.random() * 3 * HBM)]))

    seen: dict[int, Outcome] = {}

    def once(batch: int) -> Outcome:
        assert batch not in seen, f"{batch} compiled twice"
        seen[batch] = erratic(batch)
        return seen[batch]

    found = largest_batch(once, HBM, refused, log=lambda line: None)
    assert found.compiles == len(seen) <= found.bound
    assert found.bound <= compile_bound(refused, smallest=True)
    if found.batch is not None:
        assert seen[found.batch].fits and found.batch < found.refused_above <= refused
        assert found.refused_above == refused or not seen[found.refused_above].fits
