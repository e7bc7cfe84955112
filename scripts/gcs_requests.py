"""How many storage requests tpurun's commands make on gs://, and of which kinds.

    .venv/bin/python scripts/gcs_requests.py [--log requests.txt]

Runs the real CLI (Iris, 10 steps per host loop) in subprocesses against the
test GCS server (tests/fake_gcs: fake-gcs-server behind a loopback proxy, nothing
leaves 127.0.0.1) and counts the requests each part makes. A part that has no
command of its own is the difference of two runs on fresh model_dirs:

  host loop   train to 30 steps  -  train to 20 steps (one save each, at the end)
  save        (train to 30 saving every 10  -  train to 30 saving at the end) / 2
  resume      train from a model_dir at step 20 to 30 (restore, 1 loop, 1 save);
              and that minus a fresh run of 1 loop + 1 save: what restoring adds
  eval, predict, export   one command each, on the model_dir at step 30

Counts are as tpurun's processes make them: without TensorFlow's stat cache, which
tpurun turns off (docs/storage.md); `GCS_STAT_CACHE_MAX_AGE=5 python
scripts/gcs_requests.py` counts with TensorFlow's default 5-second cache (its hits
then depend on the machine's speed). `--log` writes every request of every run.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from fake_gcs.server import GcsServer  # noqa: E402 - after the path set-up above
from fake_gcs.traffic import KINDS, RequestLog  # noqa: E402
from offline_env import OFFLINE_ENV  # noqa: E402 - scripts/offline_env.py

IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10")


class Runner:
    def __init__(self, gcs: GcsServer, log_file):
        self.gcs, self.log_file = gcs, log_file
        self.env = {**os.environ, **OFFLINE_ENV, **gcs.env}

    def run(self, title: str, command: str, model_dir: str, *flags: str) -> RequestLog:
        """Runs one tpurun command; returns its requests (and fails loudly if it failed)."""
        with self.gcs.counting() as log:
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tpurun",
                    command,
                    *IRIS,
                    f"--model_dir={model_dir}",
                    *flags,
                ],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        if result.returncode != 0:
            sys.exit(f"{title}: tpurun {command} failed:\n{result.stderr}")
        if self.log_file:
            print(f"## {title}: tpurun {command} {' '.join(flags)}\n{log}\n", file=self.log_file)
        return log


def kinds(log: RequestLog) -> collections.Counter[str]:
    counts = log.kinds()
    counts["total"] = len(log)
    return counts


def row(title: str, counts: collections.Counter[str], divide: int = 1) -> str:
    columns = ["total", *KINDS[:6]]
    cells = [_cell(counts[c], divide) for c in columns]
    return f"{title:<34}" + "".join(f"{c:>9}" for c in cells)


def _cell(value: int, divide: int) -> str:
    return str(value // divide) if value % divide == 0 else f"{value / divide:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, help="write every request of every run here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, GcsServer(Path(tmp)) as gcs:
        log_file = open(args.log, "w") if args.log else None  # noqa: SIM115 - closed below
        runner = Runner(gcs, log_file)
        bucket = gcs.make_bucket("requests")

        def fresh(name: str) -> str:
            return f"{bucket}/{name}"

        two = runner.run("2 loops", "train", fresh("two"), "--train_steps=20")
        three = runner.run("3 loops", "train", fresh("three"), "--train_steps=30")
        saving = runner.run(
            "3 loops, 3 saves",
            "train",
            fresh("saving"),
            "--train_steps=30",
            "--save_checkpoints_steps=10",
        )
        one = runner.run("1 loop", "train", fresh("one"), "--train_steps=10")
        resumed = runner.run("resume 20 -> 30", "train", fresh("two"), "--train_steps=30")
        model_dir = fresh("three")
        evaluation = runner.run("eval", "eval", model_dir)
        prediction = runner.run("predict", "predict", model_dir)
        export = runner.run("export", "export", model_dir)
        if log_file:
            log_file.close()

    header = f"{'':<34}" + "".join(f"{c:>9}" for c in ["total", *KINDS[:6]])
    print(header)
    print(row("train, 1 loop + 1 save (fresh)", kinds(one)))
    print(row("train, 2 loops + 1 save (fresh)", kinds(two)))
    print(row("train, 3 loops + 1 save (fresh)", kinds(three)))
    print(row("train, 3 loops + 3 saves (fresh)", kinds(saving)))
    print(row("(a) one host loop, no save", _difference(kinds(three), kinds(two))))
    print(row("(b) one checkpoint save", _difference(kinds(saving), kinds(three)), divide=2))
    print(row("(c) resume 20 -> 30 (whole run)", kinds(resumed)))
    print(row("(c) what restoring adds", _difference(kinds(resumed), kinds(one))))
    print(row("(d) eval", kinds(evaluation)))
    print(row("    predict", kinds(prediction)))
    print(row("(e) export", kinds(export)))


def _difference(
    a: collections.Counter[str], b: collections.Counter[str]
) -> collections.Counter[str]:
    """a - b, keeping negative counts (Counter's `-` drops them)."""
    result = collections.Counter(a)
    result.subtract(b)
    return result


if __name__ == "__main__":
    main()
