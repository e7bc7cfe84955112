"""The largest per-replica batch that fits, in a number of compiles stated in advance.

`largest_batch(probe, hbm_bytes, refused)` searches the batches below `refused` (a
per-replica batch that does not fit) for the largest one that fits, `probe(batch)`
compiling the step at one batch (seconds to minutes each). It searches multiples
of 8 (a TPU pads the batch dimension to one), and the batches below 8 only when
not even 8 fits.

The worst case, kept whatever the sizes do: for `refused` = B, at most
`compile_bound(B)` = ceil(log2(B / 8)) + EXTRA_PROBES compiles, and
ceil(log2(8)) = 3 more when not even a batch of 8 fits (`compile_bound`). It is
a bisection's count (ceil(log2(B / 8)) halvings take the interval [8, B) down to
one multiple of 8) plus two probes of slack, spent on guesses.

Each probe is either a guess at where the memory crosses the HBM, on the line
through the totals compiled nearest it (memory grows about linearly with the
batch), or the midpoint of the batches still in question: the midpoint when no
total is known yet (a refusal gives none) and after a guess that did not halve
them (`_guess`). Either is then held inside the interval that keeps the bound
(the projection of the ITP method: Oliveira and Takahashi, "An Enhancement of the
Bisection Method Average Performance Preserving Minmax Optimality", ACM TOMS
47(1), 2020): after the k-th probe, the batches still in question must span at
most 2^(n - k) multiples of 8, n being the probes allowed, so that bisection alone
could still finish in the probes left. A probe outside that interval is moved to
its nearest end, and the midpoint is always inside it: the bound holds whatever
the guesses are. When memory is close to linear, the guesses find the edge in
three or four compiles from any batch.

Near the HBM a compiler's memory is not monotonic in the batch: it recomputes
activations rather than keep them when they would not fit, so the memory flattens
and a larger batch can fit where a smaller one was refused. The search never
assumes a batch fits because a larger one did (or is refused because a smaller
one was): the answer is a batch that was compiled and fits, next to a larger one
that was compiled and refused (`Found.refused_above`). It is the largest that the
search found; a larger batch may still fit beyond a refused one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from absl import logging

# Probes the guesses may cost beyond a bisection's: the worst case is ceil(log2(B/8)) + 2.
EXTRA_PROBES = 2
# Above RESOLUTION multiples of 8, the search stops within 1/RESOLUTION of the edge
# (a search of batches in the millions would otherwise spend its last compiles on
# the last 0.1%).
RESOLUTION = 1000
# How far past the estimated edge a guess aims once guesses keep landing on one side,
# as a share of the edge (doubled with each further guess on that side).
MARGIN = 0.01


class Outcome(NamedTuple):
    """What a compile of the step at one batch said: whether it fits, and its total
    bytes (None when the compiler refused the step and gave no total)."""

    fits: bool
    bytes: int | None


Probe = Callable[[int], Outcome]


class Step(NamedTuple):
    """One probe of a search: whether it fit, the interval's span before it, and whether
    it was a guess at the edge (or a midpoint)."""

    fits: bool
    span: int
    guessed: bool


@dataclasses.dataclass(frozen=True)
class Found:
    """The search's answer, and what it cost."""

    batch: int | None  # the largest batch found to fit; None: not even a batch of 1 fits
    refused_above: int  # the smallest batch above it found not to fit (`refused` at most)
    compiles: int  # probes made (the sizes already known cost none)
    bound: int  # the most it could have made: compile_bound(refused)


def compile_bound(refused: int, multiple: int = 8, smallest: bool = False) -> int:
    """The most compiles `largest_batch` makes below a batch `refused` that does not fit:
    ceil(log2(refused / multiple)) + EXTRA_PROBES, and ceil(log2(multiple)) more for the
    batches below `multiple` (`smallest`: when not even `multiple` fits)."""
    bound = _bound(-(-refused // multiple))
    return bound + _bound(min(multiple, refused), extra=0) if smallest else bound


def largest_batch(
    probe: Probe,
    hbm_bytes: int,
    refused: int,
    *,
    multiple: int = 8,
    known: Mapping[int, Outcome] | None = None,
    log: Callable[[str], None] = logging.info,
) -> Found:
    """The largest batch below `refused` (which does not fit) that `probe` finds to fit.

    A multiple of `multiple` unless not even `multiple` fits; then the largest
    smaller batch that fits. `known` outcomes (batch -> Outcome, compiled already)
    narrow the search for free. At most compile_bound(refused) probes.
    """
    known = dict(known or {})
    bound = compile_bound(refused, multiple)
    made = 0

    def counted(batch: int) -> Outcome:
        nonlocal made
        made += 1
        log(f"Batch search: compile {made} of at most {bound}, at {batch} per replica.")
        known[batch] = probe(batch)
        return known[batch]

    units = (refused - 1) // multiple  # the multiples of `multiple` below `refused`
    fit, over = _bisect(counted, hbm_bytes, units, multiple, known, EXTRA_PROBES)
    if fit:
        return Found(fit * multiple, min(over * multiple, refused), made, bound)
    bound = compile_bound(refused, multiple, smallest=True)  # 1 .. multiple - 1 too
    small = min(multiple, refused)
    fit, over = _bisect(counted, hbm_bytes, small - 1, 1, known, extra=0)
    return Found(fit or None, over, made, bound)


def _bound(span: int, extra: int = EXTRA_PROBES) -> int:
    """Probes that settle an interval (fit, over) with over - fit = span: a bisection's
    ceil(log2(span)), and `extra`."""
    if span <= 1:
        return 0
    return (span - 1).bit_length() + extra  # ceil(log2(span)) + extra


def _bisect(
    probe: Probe,
    hbm_bytes: int,
    units: int,
    multiple: int,
    known: Mapping[int, Outcome],
    extra: int,
) -> tuple[int, int]:
    """(fit, over) in units of `multiple` among 1 .. units: the largest unit found to fit
    (0: none), and the unit above it found not to (units + 1: none was)."""
    fit, over = 0, units + 1
    sizes: dict[int, Outcome] = {b // multiple: o for b, o in known.items() if b % multiple == 0}
    for unit, outcome in sizes.items():
        if 1 <= unit <= units and outcome.fits and unit > fit:
            fit = unit
    over = min((u for u, o in sizes.items() if fit < u <= units and not o.fits), default=over)
    left = _bound(over - fit, extra)
    history: list[Step] = []
    while over - fit > 1 and over - fit > fit // RESOLUTION:
        assert left >= 1 and over - fit <= 1 << left  # the bound's invariant
        guess, guessed = _guess(sizes, hbm_bytes, fit, over, history)
        reach = 1 << (left - 1)  # after this probe, at most `reach` units may be left
        unit = min(max(guess, over - reach, fit + 1), fit + reach, over - 1)
        outcome = probe(unit * multiple)
        sizes[unit] = outcome
        history.append(Step(outcome.fits, over - fit, guessed))
        left -= 1
        if outcome.fits:
            fit = unit
        else:
            over = unit
    return fit, over


def _guess(
    sizes: Mapping[int, Outcome], hbm_bytes: int, fit: int, over: int, history: list[Step]
) -> tuple[int, bool]:
    """The next unit to try (before the bound's projection), and whether it is a guess
    at the edge (else the midpoint).

    The midpoint without a size to draw a line through, when the line crosses the
    HBM outside the interval (where memory flattens, as the compiler recomputes
    activations, the line through two sizes that fit runs past a batch refused), and
    after a guess that did not halve the interval.
    Else the estimated edge: the unit just below it at first, then just past it on
    the side the last guess did not land on; after k guesses in a row on one side,
    past it by MARGIN of it (at most a quarter of the interval) times 2^(k - 2):
    galloping, so that a line that keeps missing brackets the edge in as many
    guesses as doublings.
    """
    edge = _edge(sizes, hbm_bytes, fit, over)
    misled = history and history[-1].guessed and 2 * (over - fit) > history[-1].span
    if edge is None or misled or not fit < edge < over:  # a line against the compiles
        return (fit + over) // 2, False
    guesses = [step.fits for step in history if step.guessed]
    if not guesses:  # just below the edge: the nearest size to it that fits, if the line holds
        return math.floor(edge - max(1.0, edge / RESOLUTION)), True
    streak = next(
        (i for i, fits in enumerate(reversed(guesses)) if fits != guesses[-1]), len(guesses)
    )
    margin = (
        0 if streak == 1 else max(1, min(round(edge * MARGIN), (over - fit) // 4)) << (streak - 2)
    )
    # After a fit, a unit above the edge; after a refusal, one below.
    return (math.floor(edge) + 1 + margin if guesses[-1] else math.floor(edge) - margin), True


def _edge(sizes: Mapping[int, Outcome], hbm_bytes: int, fit: int, over: int) -> float | None:
    """Where the memory crosses the HBM (in units), on the line through the sizes nearest
    the interval (fit, over): one on each side, else the two nearest on one side, else
    one and the origin (memory in proportion to the batch). None without a size."""
    below = sorted((u, o.bytes) for u, o in sizes.items() if u <= fit and o.fits and o.bytes)
    above = sorted((u, o.bytes) for u, o in sizes.items() if u >= over and not o.fits and o.bytes)
    if below and above:
        line = [below[-1], above[0]]
    elif len(above) >= 2 or len(below) >= 2:
        line = above[:2] if len(above) >= 2 else below[-2:]
    elif above or below:
        line = [(0, 0), (above or below)[0]]
    else:
        return None
    (u0, b0), (u1, b1) = line
    if b1 <= b0:
        return None  # a line that does not rise says nothing
    return u0 + (hbm_bytes - b0) * (u1 - u0) / (b1 - b0)
