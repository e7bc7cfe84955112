"""Storage off the training path: saves and summaries on gs:// against saves off and a local disk.

    .venv/bin/python scripts/bench_storage.py [--repeats=2] [--latency=0.06]

Every run is `tpurun train` in a subprocess, with its model_dir on the test GCS
server (tests/fake_gcs: fake-gcs-server behind a loopback proxy, nothing leaves
127.0.0.1) that waits `--latency` (60 ms: a real bucket's order) before answering
each request, or on a local disk:

1. mnist (configs/mnist.py: the CNN with Adam), `--batch_size=128 --iterations=25
   --train_steps=400`, on synthetic digits (tests/synthetic_images.py: speed does
   not depend on what they show), read from a local disk: a save every 50 steps
   against saves off (only the final save), the whole process's wall time, the
   median of `--repeats`; with what the 7 saves before the last took and how long
   the loop waited for them (their log lines). Target on gs://: within 1.15x. Also
   the saves with `--config.train.async_checkpoint=false`: the loop waits for each
   whole save, as before this change.
2. Iris, `--iterations=100`, saves off: what a host loop costs, the median time
   between two loops' log lines (training, summaries, progress, lease), on gs://
   against a local disk. Target: at most 15 ms more.
3. The bytes uploaded for TensorBoard events (request bodies naming an events
   file, counted at the proxy) over 100 and 1,000 such Iris loops: target about
   10x (linear in the run), not 100x (every upload the whole file again).
4. No target: the mnist pair on a local disk; Iris with a save every 500 steps
   (its config's) against none on a local disk, in microseconds per step (the
   median of `--repeats`).

Timings on a shared machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from fake_gcs.server import GcsServer  # noqa: E402 - after the path set-up above
from offline_env import OFFLINE_ENV  # noqa: E402 - scripts/offline_env.py
from synthetic_images import write_digit_records  # noqa: E402 - tests/synthetic_images.py

MNIST = ("--config=mnist", "--use_tpu=false", "--batch_size=128", "--iterations=25")
MNIST_STEPS = 400
IRIS = ("--config=iris", "--use_tpu=false", "--iterations=100")
SAVES_OFF = ("--save_checkpoints_steps=0", "--save_checkpoints_secs=0")
# absl's log line: "I1127 12:34:56.789012 140... controller.py:12] step 200/1000 ..."
LOOP_LINE = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d{6}) .*\] step (\d+)/\d+ ", re.M)
# "Saved checkpoint ... (written in the background in 2.41s; training waited 0.03s for it)",
# or "(written in 2.41s while training waited)"
SAVED = re.compile(
    r"Saved checkpoint \S+ \(written (?:in the background )?in ([\d.]+)s(; training waited ([\d.]+)s)?"
)


class Runs:
    """Runs `tpurun train` in subprocesses, on gs:// (the test server) or a local disk."""

    def __init__(self, gcs: GcsServer, tmp: Path):
        self.gcs, self.tmp = gcs, tmp
        self.bucket = gcs.make_bucket("bench-storage")
        self._count = 0
        self._env = {**os.environ, **OFFLINE_ENV, **gcs.env}
        self._env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # tpurun sets its own

    def model_dir(self, where: str) -> str:
        self._count += 1
        if where == "gs":
            return f"{self.bucket}/run-{self._count}"
        return str(self.tmp / f"run-{self._count}")

    def train(self, where: str, *flags: str) -> tuple[float, str]:
        """(wall seconds, stderr) of one run on a fresh model_dir."""
        command = [sys.executable, "-m", "tpurun", "train", *flags]
        command.append(f"--model_dir={self.model_dir(where)}")
        started = time.perf_counter()
        result = subprocess.run(command, env=self._env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            sys.exit(f"failed: {' '.join(command)}\n{result.stderr[-5000:]}")
        return seconds, result.stderr


def loop_times(stderr: str) -> list[tuple[float, int]]:
    """(seconds of the day, step) of every host loop's log line."""
    return [
        (int(h) * 3600 + int(m) * 60 + float(s), int(step))
        for h, m, s, step in LOOP_LINE.findall(stderr)
    ]


def loop_cost(stderr: str) -> float:
    """The median time between two consecutive host loops' log lines, in seconds."""
    times = [t for t, _ in loop_times(stderr)][1:]  # the first loop compiles
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def per_step(stderr: str) -> float:
    """Seconds per step from the second loop's line to the last one."""
    stamps = loop_times(stderr)[1:]
    (first, first_step), (last, last_step) = stamps[0], stamps[-1]
    return (last - first) / (last_step - first_step)


@contextlib.contextmanager
def latency(gcs: GcsServer, seconds: float) -> Iterator[None]:
    gcs.slow(seconds)
    try:
        yield
    finally:
        gcs.clear_faults()


def waited(stderr: str) -> tuple[float, float]:
    """(seconds the training loop waited for its saves but the last, seconds those saves
    took), from their log lines."""
    saves = [
        (float(took), float(wait) if background else float(took))
        for took, background, wait in SAVED.findall(stderr)
    ][:-1]
    return sum(w for _, w in saves), sum(t for t, _ in saves)


def mnist_runs(
    runs: Runs, where: str, data: Path, repeats: int, *cases: tuple[str, ...]
) -> list[tuple[float, tuple[float, float]]]:
    """For each case (its extra flags): the median wall seconds, and (waited, took) of the
    median run's saves."""
    common = (*MNIST, f"--data_dir={data}", f"--train_steps={MNIST_STEPS}")
    done: list[list[tuple[float, str]]] = [[] for _ in cases]
    for _ in range(repeats):  # interleaved: a change in the machine's load hits every case
        for case, flags in zip(done, cases, strict=True):
            case.append(runs.train(where, *common, *flags))
    medians = [sorted(case)[(len(case) - 1) // 2] for case in done]
    return [(seconds, waited(stderr)) for seconds, stderr in medians]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mnist case")
    parser.add_argument("--latency", type=float, default=0.06, help="seconds per gs:// request")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}  ({datetime.datetime.now():%H:%M})")
    with tempfile.TemporaryDirectory() as tmp_name, GcsServer(Path(tmp_name)) as gcs:
        tmp = Path(tmp_name)
        runs = Runs(gcs, tmp)
        data = write_digit_records(tmp / "digits", train=2560, test=100, examples_per_file=640)

        every_50 = ("--save_checkpoints_steps=50",)
        waiting = (*every_50, "--config.train.async_checkpoint=false")
        with latency(gcs, args.latency):
            gs = mnist_runs(runs, "gs", data, args.repeats, every_50, SAVES_OFF, waiting)
        local = mnist_runs(runs, "local", data, args.repeats, every_50, SAVES_OFF)

        iris_steps = {loops: f"--train_steps={loops * 100}" for loops in (100, 1000)}
        _, local_iris = runs.train("local", *IRIS, *SAVES_OFF, iris_steps[1000])
        events_bytes = {}
        with latency(gcs, args.latency):
            for loops in (100, 1000):
                with gcs.counting() as log:
                    _, gs_iris = runs.train("gs", *IRIS, *SAVES_OFF, iris_steps[loops])
                events_bytes[loops] = log.body_bytes(kind="upload", path="tfevents")
        saving_iris, unsaved_iris = [], []
        for _ in range(args.repeats):  # interleaved, as the mnist runs
            saving_iris.append(per_step(runs.train("local", *IRIS, "--train_steps=50000")[1]))
            unsaved = runs.train("local", *IRIS, *SAVES_OFF, "--train_steps=50000")[1]
            unsaved_iris.append(per_step(unsaved))

    ms = 1000
    print(f"\nmnist, --batch_size=128 --iterations=25 --train_steps={MNIST_STEPS}, wall s")
    print(
        f"{'model_dir':<40}{'save every 50':>14}{'saves off':>11}{'ratio':>7}"
        f"{'7 saves took':>14}{'loop waited':>13}"
    )
    gs_name = f"gs:// (+{args.latency * ms:.0f} ms per request)"
    rows = [(gs_name, gs[0], gs[1]), ("local disk", local[0], local[1])]
    rows.append(("gs://, async_checkpoint=false (before)", gs[2], gs[1]))
    for name, (saving, (wait, took)), (off, _) in rows:
        print(f"{name:<40}{saving:>14.1f}{off:>11.1f}{saving / off:>7.2f}", end="")
        print(f"{took:>13.1f}s{wait:>12.2f}s")
    ratio = gs[0][0] / gs[1][0]
    print(f"  gs:// save every 50 / saves off = {ratio:.2f}  (target <= 1.15)")

    gs_cost, local_cost = loop_cost(gs_iris), loop_cost(local_iris)
    print("\nIris, --iterations=100, saves off: a host loop, median ms")
    print(f"  local disk {local_cost * ms:.1f}, gs:// {gs_cost * ms:.1f}: ", end="")
    print(f"{(gs_cost - local_cost) * ms:+.1f} ms  (target <= +15)")

    growth = events_bytes[1000] / max(events_bytes[100], 1)
    print("\nTensorBoard events uploaded to gs://, Iris saves off")
    print(
        f"  100 loops {events_bytes[100]:,} bytes, 1,000 loops {events_bytes[1000]:,} bytes: ",
        end="",
    )
    print(f"{growth:.1f}x  (target about 10x, not 100x)")

    saving_us = statistics.median(saving_iris) * 1e6
    unsaved_us = statistics.median(unsaved_iris) * 1e6
    print("\nIris on a local disk, --iterations=100, 50,000 steps (no target)")
    print(f"  a save every 500 steps {saving_us:.1f} us/step, saves off {unsaved_us:.1f} us/step")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
