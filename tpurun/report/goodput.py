"""Where a model_dir's training time went, from its run records: pure arithmetic, no I/O.

Each train process writes, as it goes, its time account into its run record
(`tpurun.layout.time_account.TimeAccount`: each field and what it means).

`account` splits the time from the first process's start to the last one's end into
the categories below; they add up to `wall_s` by construction (`other` is what is
left of each process's time). A trainer killed before it wrote its record has one
its supervisor wrote (`tpurun.supervisor.post_mortem`), or is counted from the gap
in its supervisor's restart numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from tpurun.layout.time_account import (
    FINISHED,
    PREEMPTED,
    Death,
    End,
    FirstLoop,
    Last,
    Loops,
    TimeAccount,
)
from tpurun.run_config.keys.determinism import verdict

CATEGORIES = (
    "startup",  # process start to the first step: imports, cluster, TPU init, build, restore
    "compile",  # the first host loop beyond a steady one of as many steps
    "checkpoint",  # the time the loop waited for saves
    "evaluation",  # in-process evaluations
    "input_wait",  # steps waiting for their batches
    "lost_progress",  # steps trained after the last checkpoint before a death, trained again
    "downtime",  # from a death to the next start
    "other",  # the rest: the host between loops, the end of a run
)


@dataclasses.dataclass(frozen=True)
class Report:
    wall_s: float
    goodput_s: float
    badput_s: dict[str, float]
    disruptions: int
    restarts: int
    steps: int
    model_flops_per_step: float | None
    achieved_flops_per_s: float | None
    mfu: float | None
    processes: int = 0
    step_seconds: float | None = None  # a steady step's time, the newest process's
    mfu_why: str | None = None  # why mfu is null
    # Whether a resume of the newest process's run is bit-identical, and why; None: its
    # record does not say (written before records kept it).
    resume: str | None = None

    @property
    def goodput_share(self) -> float:
        return self.goodput_s / self.wall_s if self.wall_s > 0 else 0.0

    def largest_badput(self) -> tuple[str, float]:
        name = max(CATEGORIES, key=lambda c: self.badput_s[c])
        return name, self.badput_s[name]

    def as_json(self) -> dict[str, Any]:
        """`tpurun report --json`: the fields above `processes`, and `resume`."""
        fields = dataclasses.asdict(self)
        for name in ("processes", "step_seconds", "mfu_why"):
            del fields[name]
        return fields


@dataclasses.dataclass
class _Process:
    record: TimeAccount
    start: float
    end: float = 0.0
    died: bool = False  # ended without saying how (killed): its end is the death's time
    heard_step: int = 0  # its last step as its supervisor heard it (after its record's last)

    @property
    def trained(self) -> bool:
        return self.record.training_start is not None

    @property
    def first_step(self) -> int:
        assert self.record.training_start is not None
        return int(self.record.training_start.step)

    @property
    def last_step(self) -> int:
        last = self.record.last or Last()
        return int(last.step if last.step is not None else self.first_step)

    @property
    def last_t(self) -> float:
        return float(self.record.updated or self.start)

    @property
    def loops(self) -> Loops:
        return self.record.loops or Loops()

    @property
    def first_loop(self) -> FirstLoop:
        return self.record.first_loop or FirstLoop()

    @property
    def ending(self) -> End | None:
        return self.record.end


def processes(records: Sequence[TimeAccount]) -> list[_Process]:
    """The train processes of `records` (each a run record's account), oldest first, with
    their ends: as recorded, else the death the next process was told of, else the last
    update."""
    # One process per start: a process whose record could not be rewritten at its end wrote
    # its account again under a new name (`GoodputRecord.finish`); the most complete counts.
    newest: dict[float, TimeAccount] = {}
    for g in records:
        start = float(g.process_start)
        if start not in newest or _completeness(g) > _completeness(newest[start]):
            newest[start] = g
    found = sorted((_Process(g, start) for start, g in newest.items()), key=lambda p: p.start)
    for i, p in enumerate(found):
        if p.ending:
            p.end = float(p.ending.t)
            continue
        p.died = True
        following = found[i + 1] if i + 1 < len(found) else None
        death = (following.record.previous_death if following else None) or Death()
        if death.step_t and p.trained and float(death.step_t) >= p.last_t:
            # The supervisor heard of its last step, and when: it trained until then (the
            # steps after its record's last write: lost progress, counted as time); what
            # follows (the loop it was in, its teardown) is downtime.
            p.end = float(death.step_t)
            p.heard_step = int(death.step or 0)
            continue
        p.end = float(death.t) if death.t else p.last_t
        p.end = max(p.end, p.last_t)
    # Two trainers never run at once in one model_dir (the lease): one whose end the
    # records put after the next one's start (clocks that stepped, a --force_takeover of
    # a hung trainer) is counted until that start, so no second is counted twice.
    for p, following in zip(found, found[1:], strict=False):
        p.end = min(p.end, following.start)
    return found


def _completeness(goodput: TimeAccount) -> tuple[bool, float]:
    return goodput.end is not None, float(goodput.updated or 0.0)


def _unrecorded(found: Sequence[_Process]) -> tuple[int, int]:
    """(disruptions, restarts) of trainers a supervisor started that left no record: the
    numbers missing below the highest `restart` of the records of one supervisor
    (`supervisor_start`). Each of them died (a later one was started); all but the first
    trainer were restarts."""
    numbers: dict[float, set[int]] = {}
    for p in found:
        since, restart = p.record.supervisor_start, p.record.restart
        if since is not None and restart is not None:
            numbers.setdefault(float(since), set()).add(int(restart))
    missing = [set(range(max(seen) + 1)) - seen for seen in numbers.values()]
    return sum(len(m) for m in missing), sum(len(m - {0}) for m in missing)


def account(records: Sequence[TimeAccount]) -> Report:
    """The report over the time accounts of a model_dir's train run records."""
    found = processes(records)
    badput = dict.fromkeys(CATEGORIES, 0.0)
    if not found:
        return Report(0.0, 0.0, badput, 0, 0, 0, None, None, None, mfu_why="no train run")
    goodput = 0.0
    kept_steps = 0
    step_seconds = None
    disruptions, restarts = _unrecorded(found)
    for i, p in enumerate(found):
        later = found[i + 1 :]
        if p.record.previous_death is not None and p.record.restart:
            restarts += 1
        finished = p.ending is not None and p.ending.reason == FINISHED
        if (later and not finished) or (not later and p.died):
            disruptions += 1
        parts, kept_s, kept, step_time = _split(p, later)
        goodput += kept_s
        kept_steps += kept
        step_seconds = step_time if step_time is not None else step_seconds
        for name in CATEGORIES:
            badput[name] += parts[name]
        if later:
            badput["downtime"] += max(0.0, later[0].start - p.end)
    wall = found[-1].end - found[0].start
    flops = _newest(found, lambda g: g.model_flops_per_step)
    peak = _newest(found, lambda g: g.peak_flops_per_s)
    achieved = flops / step_seconds if flops and step_seconds else None
    mfu = achieved / peak if achieved and peak else None
    why = None
    if mfu is not None and mfu > 1:  # more than the device can: the records' figures are not
        mfu, why = None, f"the records' FLOPs and step time give {mfu:.0%} of the peak, past 100%"
    elif mfu is None:
        why = (
            (_newest(found, lambda g: g.peak_why) or "no peak FLOP/s known for this device")
            if flops
            else "the FLOPs of the train step were not counted (a run that finished counts them)"
        )
    return Report(
        wall_s=wall,
        goodput_s=goodput,
        badput_s=badput,
        disruptions=disruptions,
        restarts=restarts,
        steps=kept_steps,
        model_flops_per_step=flops,
        achieved_flops_per_s=achieved,
        mfu=mfu,
        processes=len(found),
        step_seconds=step_seconds,
        mfu_why=why,
        resume=verdict(_newest(found, lambda g: g.resume)),
    )


def _split(
    p: _Process, later: Sequence[_Process]
) -> tuple[dict[str, float], float, int, float | None]:
    """One process's time: its badput by category, its goodput (seconds on steps the final
    checkpoint kept), those steps, and its steady step time (None if it trained none)."""
    parts = dict.fromkeys(CATEGORIES, 0.0)
    duration = p.end - p.start
    if not p.trained:
        parts["startup"] = duration
        return parts, 0.0, 0, None
    assert p.record.training_start is not None
    parts["startup"] = max(0.0, float(p.record.training_start.t) - p.start)
    loops, first = p.loops, p.first_loop
    seconds = float(loops.seconds or 0.0)
    waited = float(loops.input_seconds or 0.0)
    steps = int(loops.steps or 0)
    first_busy = float(first.seconds or 0.0) - float(first.input_seconds or 0.0)
    first_steps = int(first.steps or 0)
    step_time: float | None = None
    if steps > first_steps:
        step_time = max(0.0, seconds - waited - first_busy) / (steps - first_steps)
    elif steps:
        step_time = max(0.0, seconds - waited) / steps  # one loop: its compile is in it
    compile_s = max(0.0, first_busy - first_steps * step_time) if step_time is not None else 0.0
    busy = max(0.0, seconds - waited - compile_s)
    parts["compile"] = compile_s
    parts["input_wait"] = waited
    parts["checkpoint"] = sum(float(s.blocking_s) for s in p.record.saves)
    parts["evaluation"] = sum(float(e.seconds) for e in p.record.evaluations)
    # A killed process's time after its last record was written: training (it was in a
    # host loop, most likely), up to the step its supervisor heard of last.
    tail = max(0.0, p.end - p.last_t) if p.died else 0.0
    trained = max(0, max(p.last_step, p.heard_step) - p.first_step)
    kept_to = _kept_to(p, later)
    kept = min(trained, max(0, kept_to - p.first_step))
    # The kept steps' time: at the steady step time (the loops' time is that times their
    # steps), never more than the process spent training.
    kept_s = min(busy + tail, kept * step_time) if step_time is not None else 0.0
    parts["lost_progress"] = max(0.0, busy + tail - kept_s)
    by_clock = _lost_by_the_clock(p, kept_to, compile_s, waited, trained - kept, trained)
    if p.died and by_clock is not None:
        parts["lost_progress"] = by_clock
    parts["other"] = duration - sum(parts.values()) - kept_s
    kept_s = _balanced(parts, kept_s)
    return parts, kept_s, kept, step_time


def _balanced(parts: dict[str, float], kept_s: float) -> float:
    """The kept steps' time, with `parts` made to add up to the process's time, none negative:
    a deficit in `other` (estimates that overshoot: the steady step time, the lost steps by
    the clock, a life cut at the next process's start) is taken from the lost progress
    first, then from the goodput, then from the other categories."""
    deficit = max(0.0, -parts["other"])
    parts["other"] = max(0.0, parts["other"])
    deficit = _take(parts, "lost_progress", deficit)
    taken = min(deficit, kept_s) if deficit > 0 else 0.0  # then from the goodput
    kept_s, deficit = kept_s - taken, deficit - taken
    for name in CATEGORIES:
        deficit = _take(parts, name, deficit)
    return kept_s


def _take(parts: dict[str, float], name: str, deficit: float) -> float:
    """Takes what it can of `deficit` from `parts[name]`; what is left of it."""
    taken = min(deficit, parts[name]) if deficit > 0 else 0.0
    parts[name] -= taken
    return deficit - taken


def _lost_by_the_clock(
    p: _Process, kept_to: int, compile_s: float, waited: float, lost: int, trained: int
) -> float | None:
    """A killed process's time from the step the next one resumed at to its last step, by
    the clock (the host between the loops too), less the saves' and evaluations' blocking
    time and the input wait in it; None when the moment of that step is not known."""
    if kept_to <= p.first_step:
        assert p.record.training_start is not None
        reached = float(p.record.training_start.t) + compile_s
    else:
        at = [s.reached_t for s in p.record.saves if int(s.step) == kept_to]
        if not at or at[-1] is None:
            return None
        reached = float(at[-1])
    blocked = sum(float(s.blocking_s) for s in p.record.saves if float(s.t) > reached)
    blocked += sum(float(e.seconds) for e in p.record.evaluations if float(e.t) > reached)
    input_share = waited * lost / trained if trained else 0.0
    return max(0.0, p.end - reached - blocked - input_share)


def _kept_to(p: _Process, later: Sequence[_Process]) -> int:
    """The last step of `p` that the final checkpoint still holds: the step a later process
    restored (the lowest, if several), else p's last step if it saved at its end, else its
    last save."""
    restored = [q.first_step for q in later if q.trained]
    if restored:
        return min(restored)
    if not p.died and p.ending is not None and p.ending.reason in (FINISHED, PREEMPTED):
        return p.last_step
    saves = [int(s.step) for s in p.record.saves if int(s.step) <= p.last_step]
    return max(saves, default=p.first_step)


def _newest(found: Sequence[_Process], field: Callable[[TimeAccount], Any]) -> Any:
    """`field` of the newest record that has it."""
    for p in reversed(found):
        if field(p.record) is not None:
            return field(p.record)
    return None
