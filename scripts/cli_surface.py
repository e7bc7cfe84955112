"""tpurun's command-line surface, written to a directory, to compare two trees' behaviour.

What a user sees of every command without training anything: `tpurun --help`, each
command's `--help`, `tpurun list`, a few refused command lines, and for every shipped
config `tpurun check` (its findings) and `tpurun check --target=v5e-8 --report` (the
JSON figures). A change that only moves code (a refactor) must leave all of it
identical:

    python scripts/cli_surface.py --out=/tmp/surface-before      # on the old tree
    python scripts/cli_surface.py --out=/tmp/surface-after       # on the new one
    diff -r /tmp/surface-before /tmp/surface-after

`--quick` leaves out the checks (seconds instead of minutes). Lines that say how long
something took (the TPU compiler's sizing log lines) are dropped: they differ by run.
The figures of `check --target`'s input measurement (examples/s here, cores busy) are
measured, so they differ by run too: compare their verdicts.

Each run works in a scratch directory of its own (two runs at once, one per tree, must
not empty each other's), named in the output as `/tmp/tpurun-cli-surface` whatever it is.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from tpurun.run_config.command_table import COMMANDS

CONFIGS = ("iris", "mnist", "fashion_mnist", "shakespeare", "wgan_gp", "flops", "resnet50")
REPO = pathlib.Path(__file__).resolve().parent.parent
REFUSED = {
    "unknown-command": ["trian"],
    "unknown-flag": ["train", "--batchsize=8"],
    "bad-batch": ["train", "--batch_size=7", "--num_shards=2", "--use_tpu=false"],
    "flag-of-another-command": ["eval", "--export_dir=/tmp/x"],
    "bad-config-key": ["train", "--config.optimizer.learnin_rate=0.1"],
    "tpu-name-without-zone": ["train", "--tpu=my-tpu"],
    "report-without-target": ["check", "--report=/tmp/x.json"],
}
# absl's log line prefix (I1127 12:31:44.990166 140381511342976 preflight.py:170]) and
# figures of time, which differ from one run to the next.
_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.]+:\d+\] ")
_SECONDS = re.compile(r"\bin \d+(\.\d+)? s\b")


# The name the scratch directory is written as in the output (its own name differs by run).
SHOWN_CWD = "/tmp/tpurun-cli-surface"


def run_tpurun(args: list[str], cwd: str) -> str:
    env = dict(os.environ, NO_GCE_CHECK="true", GCE_METADATA_HOST="127.0.0.1:1")
    env.update(GCE_METADATA_IP="127.0.0.1:1", GCS_RETRY_CONFIG_MAX_RETRIES="0")
    result = subprocess.run(
        [sys.executable, "-m", "tpurun", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
    )
    lines = [f"exit {result.returncode}", "--- stdout", *result.stdout.splitlines(), "--- stderr"]
    for line in result.stderr.splitlines():
        if _LOG_PREFIX.match(line):
            continue
        lines.append(_SECONDS.sub("in N s", line))
    return "\n".join(lines).replace(cwd, SHOWN_CWD) + "\n"


def data_flags(directory: pathlib.Path) -> dict[str, list[str]]:
    """The configs' data, made here (the tests' synthetic digits, a short text), as flags."""
    sys.path.insert(0, str(REPO / "tests"))
    from synthetic_images import write_digit_records

    digits = write_digit_records(directory / "digits", train=64, test=16, examples_per_file=32)
    text = directory / "text.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 200)
    image_flags = [f"--data_dir={digits}"]
    return {
        "mnist": image_flags,
        "fashion_mnist": image_flags,
        "wgan_gp": image_flags,
        "shakespeare": [f"--config.data.path={text}"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the directory to write the surface to")
    parser.add_argument("--quick", action="store_true", help="leave out tpurun check")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # An empty working directory of this run's own: `list` shows no config files there, and
    # the --report path the check prints is the same in both trees (written as SHOWN_CWD).
    cwd = tempfile.mkdtemp(prefix="tpurun-cli-surface-")
    try:
        write_surface(out, cwd, args.quick)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def write_surface(out: pathlib.Path, cwd: str, quick: bool) -> None:
    (out / "help.txt").write_text(run_tpurun(["--help"], cwd))
    (out / "version.txt").write_text(run_tpurun(["--version"], cwd))
    for command in (c.name for c in COMMANDS):
        (out / f"help-{command}.txt").write_text(run_tpurun([command, "--help"], cwd))
    (out / "list.txt").write_text(run_tpurun(["list"], cwd))
    for name, argv in REFUSED.items():
        (out / f"refused-{name}.txt").write_text(run_tpurun(argv, cwd))
    if quick:
        return
    data = data_flags(pathlib.Path(cwd) / "data")
    for config in CONFIGS:
        print(f"checking {config}", file=sys.stderr)
        flags = data.get(config, [])
        text = run_tpurun(["check", f"--config={config}", *flags], cwd)
        (out / f"check-{config}.txt").write_text(text)
        report = pathlib.Path(cwd) / f"{config}.json"
        text = run_tpurun(
            ["check", f"--config={config}", "--target=v5e-8", f"--report={report}", *flags], cwd
        )
        (out / f"check-target-{config}.txt").write_text(text)
        if report.exists():
            (out / f"check-target-{config}.json").write_text(
                report.read_text().replace(cwd, SHOWN_CWD)
            )


if __name__ == "__main__":
    main()
