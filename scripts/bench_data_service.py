"""Benchmark of the tf.data service: the same training in-process and through one service worker.

    .venv/bin/python scripts/bench_data_service.py [--steps=N] [--repeats=R]

Two configurations, each trained `--repeats` times in turn in-process (the input made
by the trainer, as without config.data.service) and through a tf.data service (a
dispatcher and one worker, `tpurun data-service`, processes of their own on this
machine, 127.0.0.1):

1. input-bound: the CPU-sized ResNet (`resnet50:cpu`: 32x32 crops, width 8) with its JPEG
   pipeline (decode and crop, resize, flip) on ImageNet-sized synthetic JPEGs (300 to 500
   pixels a side, ~100 KB, bench_resnet.py's) at --resnet_batch: a step of that model is
   cheap, the JPEGs are not;
2. not input-bound: mnist on synthetic digit TFRecords (tests/synthetic_images.py) at
   batch 32, whose step outweighs its input: what the service costs a step (each batch
   compressed, sent over gRPC, received).

Examples/s of a run come from its run record's time account: the host loops after the
first (which compiles), examples over seconds. On one machine the worker's CPUs are
the trainer's: the service cannot add cores here, so the input-bound ratio says what
moving the pipeline to another process costs or saves on the same cores; on CPU VMs
beside a TPU host the worker's cores are added. Timings on a shared machine are noisy:
every run's figure is printed, with the load average before and after; compare ratios
of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from offline_env import OFFLINE_ENV, free_local_ports  # scripts/offline_env.py

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    parser.add_argument("--iterations", type=int, default=20, help="steps per host loop")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, in turn")
    parser.add_argument("--resnet_batch", type=int, default=64, help="resnet50:cpu's batch")
    parser.add_argument("--images", type=int, default=512, help="synthetic JPEGs written")
    return parser.parse_args()


class Server:
    """`tpurun data-service ...` in a process of its own; waits for a line of its stdout."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tpurun", "data-service", *args],
            env={**os.environ, **OFFLINE_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def wait_for(self, text: str) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if text in line:
                return
        raise SystemExit(f"the server ended before {text!r}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def measured(model_dir: Path) -> tuple[float, float]:
    """From the newest train record, the host loops after the first (which compiles):
    examples / seconds, and the share of those seconds the steps waited for their input."""
    record = json.loads(sorted((model_dir / "runs").glob("*-train.json"))[-1].read_text())
    account, config = record["goodput"], record["run_config"]["config"]
    loops, first = account["loops"], account["first_loop"]
    steps, seconds = loops["steps"] - first["steps"], loops["seconds"] - first["seconds"]
    waited = loops["input_seconds"] - first["input_seconds"]
    return steps * config["train"]["batch_size"] / seconds, waited / seconds


def train(args: list[str], model_dir: Path) -> tuple[float, float]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpurun",
            "train",
            "--use_tpu=false",
            f"--model_dir={model_dir}",
            *args,
        ],
        env={**os.environ, **OFFLINE_ENV},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-3000:])
        raise SystemExit(f"tpurun train {' '.join(args)} failed (exit {result.returncode})")
    return measured(model_dir)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    args = parse_args()
    from bench_resnet import write_data  # ImageNet-sized JPEGs, imagenet_to_gcs's format
    from synthetic_images import write_digit_records

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        images = root / "imagenet"
        images.mkdir()
        write_data(images, args.images)
        digits = write_digit_records(root / "digits", train=2048, test=64)
        loop = (f"--train_steps={args.steps}", f"--iterations={args.iterations}")
        configs = {
            "resnet50:cpu (JPEGs, input-bound)": (
                "--config=resnet50:cpu",
                f"--data_dir={images}",
                f"--batch_size={args.resnet_batch}",
                f"--config.data.train_examples={args.images}",
                "--config.num_classes=1000",  # bench_resnet's labels: ImageNet's 1..1000
                *loop,
            ),
            "mnist (not input-bound)": (
                "--config=mnist",
                f"--data_dir={digits}",
                "--batch_size=32",
                *loop,
            ),
        }
        port, worker_port = free_local_ports(2)
        dispatcher = Server("dispatcher", f"--port={port}")
        worker = Server(
            "worker",
            f"--dispatcher=127.0.0.1:{port}",
            f"--port={worker_port}",
            "--worker_address=127.0.0.1",
        )
        try:
            dispatcher.wait_for("serving on port")
            worker.wait_for("registered with the dispatcher")
            service = (f"--config.data.service=grpc://127.0.0.1:{port}",)
            print(f"load average before: {load()}")
            results: dict[str, dict[str, list[float]]] = {}
            for repeat in range(args.repeats):
                for name, config in configs.items():
                    slug = re.sub(r"\W", "", name)
                    for how, extra in (("in-process", ()), ("service", service)):
                        model_dir = root / f"run-{slug}-{how}-{repeat}"
                        rate, waited = train([*config, *extra], model_dir)
                        results.setdefault(name, {}).setdefault(how, []).append(rate)
                        print(
                            f"  {name:36} {how:10} run {repeat + 1}: {rate:9.1f} examples/s, "
                            f"input wait {waited:.0%}",
                            flush=True,
                        )
            print(f"load average after: {load()}")
        finally:
            worker.stop()
            dispatcher.stop()
    print()
    print(
        f"{'configuration':36} {'in-process':>12} {'service':>12} {'service/in':>11}  (median of {args.repeats}; min-max)"
    )
    for name, by in results.items():
        here, served = statistics.median(by["in-process"]), statistics.median(by["service"])
        spread = " ".join(f"{min(v):.0f}-{max(v):.0f}" for v in by.values())
        print(f"{name:36} {here:12.1f} {served:12.1f} {served / here:10.2f}x  ({spread})")


if __name__ == "__main__":
    main()
