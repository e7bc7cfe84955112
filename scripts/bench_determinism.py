"""Benchmark of config.train.deterministic: training steps per second with it on and off.

What it measures: steady steps per second of `tpurun train`, the real command in a
process of its own, with `--config.train.deterministic=true` (TensorFlow's op
determinism on, Grappler's arithmetic rewrites off, the input wait timed by the host's
clock) against `=false` (TensorFlow's defaults), for

* resnet50: the full model (`--config=resnet50`: 224x224, mixed bfloat16, the recipe's
  SGD) at global batch 8 on 1 CPU replica, on synthetic JPEGs in imagenet_to_gcs's
  TFRecords (tests/synthetic_jpegs.py); 2 steps per host loop;
* mnist: `--config=mnist` (its CNN, global batch 1024, 50 steps per host loop) on
  synthetic digits (tests/synthetic_images.py);
* iris_tfdata: Iris through tf.data (`--config.train.device_data=false`, 100 steps per
  host loop): a step of about a tenth of a millisecond, where the host clock's two calls
  into Python a step (the input wait, timed under op determinism) weigh the most.

A run's steady rate comes from its run record's time account: the steps of every host
loop but the first (which compiles) over their seconds. The two settings take turns,
round by round, the one that goes first alternating, so that a change in the machine's
load falls on both alike; each round gives a ratio (deterministic / default), and the
report gives their median and their spread (min-max), which says how noisy the machine
was. The exact command of each run is printed first.

Usage: `.venv/bin/python scripts/bench_determinism.py [--rounds=3] [--models=mnist,...]`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from offline_env import OFFLINE_ENV  # scripts/offline_env.py

REPO = Path(__file__).resolve().parent.parent
TPURUN = str(Path(sys.executable).parent / "tpurun")
SETTINGS = {"deterministic": "true", "default": "false"}
# Per model: the flags of its runs (--data_dir added where it has data of its own).
RUNS = {
    "resnet50": (
        "--config=resnet50",
        "--batch_size=8",
        "--iterations=2",
        "--train_steps=16",
        "--config.optimizer.warmup_epochs=0",
        "--save_checkpoints_steps=0",
        "--save_checkpoints_secs=0",
    ),
    "mnist": (
        "--config=mnist",
        "--iterations=50",
        "--train_steps=200",
        "--save_checkpoints_secs=0",
    ),
    # The host clock's worst case: a step of a tenth of a millisecond, fed by tf.data.
    "iris_tfdata": (
        "--config=iris",
        "--config.train.device_data=false",
        "--iterations=100",
        "--train_steps=3000",
        "--save_checkpoints_secs=0",
    ),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both settings, per model")
    parser.add_argument(
        "--models", default=",".join(RUNS), help=f"comma-separated, of {','.join(RUNS)}"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(RUNS)
    if unknown:
        raise SystemExit(f"unknown model(s) {sorted(unknown)}; choose from {sorted(RUNS)}")
    with tempfile.TemporaryDirectory() as scratch:
        data = write_data(Path(scratch), models)
        print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for model in models:
            report(
                model, [round_of(model, data[model], Path(scratch), r) for r in range(args.rounds)]
            )
        print(f"load after: {os.getloadavg()[0]:.1f}")


def write_data(scratch: Path, models: list[str]) -> dict[str, str]:
    """The models' synthetic data, written once."""
    sys.path[:0] = [str(REPO / "tests")]
    data = {}
    if "resnet50" in models:
        from synthetic_jpegs import write_imagenet  # tests/synthetic_jpegs.py

        data["resnet50"] = str(write_imagenet(scratch / "imagenet", train=64, validation=16))
    if "mnist" in models:
        from synthetic_images import write_digit_records  # tests/synthetic_images.py

        data["mnist"] = str(write_digit_records(scratch / "digits", 4096, 256, 1024))
    data["iris_tfdata"] = ""  # the config's own CSV
    return data


def command(model: str, data_dir: str, setting: str, model_dir: str) -> list[str]:
    return [
        TPURUN,
        "train",
        *RUNS[model],
        "--use_tpu=false",
        *([f"--data_dir={data_dir}"] if data_dir else []),
        f"--config.train.deterministic={SETTINGS[setting]}",
        f"--model_dir={model_dir}",
    ]


def round_of(model: str, data_dir: str, scratch: Path, number: int) -> dict[str, float]:
    """One round: a run of each setting, the first alternating; steady steps/s of each."""
    order = list(SETTINGS) if number % 2 == 0 else list(reversed(SETTINGS))
    rates = {}
    for setting in order:
        model_dir = scratch / f"{model}-{setting}-{number}"
        argv = command(model, data_dir, setting, str(model_dir))
        if number == 0:
            print("$ " + " ".join(argv).replace(str(scratch), "$SCRATCH"), flush=True)
        started = time.perf_counter()
        result = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **OFFLINE_ENV}
        )
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-3000:])
            raise SystemExit(f"{model} {setting} failed (exit {result.returncode})")
        rates[setting] = steady_rate(model_dir)
        print(
            f"  {model} round {number + 1} {setting:<13} {rates[setting]:8.3f} steps/s "
            f"({time.perf_counter() - started:.0f} s in all, load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        shutil.rmtree(model_dir)
    return rates


def steady_rate(model_dir: Path) -> float:
    """Steps per second of the run's host loops after its first (which compiles)."""
    (path,) = glob.glob(str(model_dir / "runs" / "*-train.json"))
    account = json.loads(Path(path).read_text())["goodput"]
    loops, first = account["loops"], account["first_loop"]
    return (loops["steps"] - first["steps"]) / (loops["seconds"] - first["seconds"])


def report(model: str, rounds: list[dict[str, float]]) -> None:
    ratios = [r["deterministic"] / r["default"] for r in rounds]
    medians = {s: statistics.median(r[s] for r in rounds) for s in SETTINGS}
    print(
        f"{model}: deterministic {medians['deterministic']:.3f} steps/s, default "
        f"{medians['default']:.3f} steps/s; deterministic / default = "
        f"{statistics.median(ratios):.3f} (median of {len(ratios)} rounds, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
