"""A model_dir tpurun did not leave as it was: links, look-alike names, damaged records, leftovers.

Each case starts from a copy of one trained Iris model_dir (checkpoints at steps
10 and 20), changes it as a person, a crash or a full disk would, runs tpurun in
this process, and checks that a sentinel outside the model_dir and the user's own
files are untouched, and that the command trains on or fails with one clear line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import RUN_FAILURE, USAGE, assert_fails, assert_ok, tpurun_in_process
from test_resume import assert_bit_identical

from tpurun.layout import names

pytestmark = pytest.mark.slow

# The plain host loop (XLA's, config.train.xla="auto"'s pick for Iris, is compiled by
# XLA first, more than the rest of an Iris run costs): the loop is not what this file tests
# (test_device_data.py, test_host_loops.py).
IRIS = (
    "--config=iris",
    "--use_tpu=false",
    "--iterations=10",
    "--save_checkpoints_steps=10",
    "--config.train.xla=false",
)
SENTINEL = "the user's own file\n"


def train(model_dir: Path, steps: int) -> None:
    """Trains in this process without capturing (for module fixtures)."""
    import keras

    from tpurun import cli

    keras.backend.clear_session()
    args = ["tpurun", "train", *IRIS, f"--train_steps={steps}", f"--model_dir={model_dir}"]
    assert cli.main(args) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Iris trained to step 20, a checkpoint every 10."""
    model_dir = tmp_path_factory.mktemp("trained") / "model"
    train(model_dir, 20)
    return model_dir


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The same run trained straight to step 30: what every resume must equal."""
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "model"
    train(model_dir, 30)
    return model_dir / "ckpt-30"


@pytest.fixture
def model_dir(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "model", symlinks=True))


@pytest.fixture
def outside(tmp_path) -> Path:
    """The user's directory beside the model_dir, with a file that must survive every run."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "sentinel.txt").write_text(SENTINEL)
    return path


def untouched(outside: Path) -> bool:
    return sorted(os.listdir(outside)) == ["sentinel.txt"] and (
        (outside / "sentinel.txt").read_text() == SENTINEL
    )


def train_to_30(tpurun_cli, model_dir: Path, *extra: str):
    return tpurun_cli("train", *IRIS, "--train_steps=30", f"--model_dir={model_dir}", *extra)


# --- links and look-alike names -----------------------------------------------------------


# One run over a model_dir holding every kind of name tpurun must tell apart from its
# own: links named like a save's scratch directory (the coming save's step 30, the
# newest step 20, a step older than any), the user's look-alike files, and what killed
# runs left. Each test below asserts on that one run.
LINKED_SCRATCH = ("ckpt-30_temp", "ckpt-20_temp", "ckpt-5_temp")
LOOK_ALIKES = ("ckpt-old_temp.csv", "ckpt-3.data-of-mine")
DEAD_TEMPORARY = f".train_config.json.tpurun-tmp-{names.HOST}-4999999-0123abcd"
KILLED_EXPORT = f"export/.17000.tpurun-tmp-{names.HOST}-4999998-0123abcd"
KILLED_SAVE = "ckpt-25_temp"  # a save killed before its merge (its step: any)


@pytest.fixture(scope="module")
def mixed_run(trained, tmp_path_factory):
    """(model_dir, outside, result) of a train to step 30 in a model_dir with links,
    look-alikes and leftovers of killed runs (see above)."""
    root = tmp_path_factory.mktemp("mixed")
    model_dir = Path(shutil.copytree(trained, root / "model", symlinks=True))
    outside = root / "outside"
    outside.mkdir()
    (outside / "sentinel.txt").write_text(SENTINEL)
    for name in LINKED_SCRATCH:
        (model_dir / name).symlink_to(outside, target_is_directory=True)
    (model_dir / "ckpt-notes_template").mkdir()
    (model_dir / "ckpt-notes_template" / "notes.txt").write_text(SENTINEL)
    for name in LOOK_ALIKES:
        (model_dir / name).write_text(SENTINEL)
    (model_dir / "train_config.json.tmp").symlink_to(outside / "sentinel.txt")
    (model_dir / DEAD_TEMPORARY).write_text("{")
    (model_dir / "export").mkdir()
    (model_dir / KILLED_EXPORT).mkdir()
    (model_dir / KILLED_SAVE).mkdir()
    (model_dir / KILLED_SAVE / "part-00000-of-00001.index").write_text("half a save")
    result = tpurun_in_process(
        "train", *IRIS, "--train_steps=30", f"--model_dir={model_dir}", cwd=root
    )
    return model_dir, outside, result


def test_links_named_like_a_save_scratch_are_unlinked_and_their_target_kept(mixed_run):
    model_dir, outside, result = mixed_run
    assert_ok(result)
    assert not [name for name in LINKED_SCRATCH if (model_dir / name).is_symlink()]
    assert (model_dir / "ckpt-30.index").exists()
    assert untouched(outside)


def test_the_users_look_alike_files_are_left_alone(mixed_run):
    model_dir, outside, result = mixed_run
    assert_ok(result)
    assert (model_dir / "ckpt-notes_template" / "notes.txt").read_text() == SENTINEL
    for name in LOOK_ALIKES:
        assert (model_dir / name).read_text() == SENTINEL
    assert (model_dir / "train_config.json.tmp").is_symlink()
    assert untouched(outside)


def test_leftovers_of_a_killed_run_are_removed_by_the_next(mixed_run):
    model_dir, _, result = mixed_run
    assert_ok(result)
    assert not (model_dir / DEAD_TEMPORARY).exists()
    assert not (model_dir / KILLED_EXPORT).exists()
    assert not (model_dir / KILLED_SAVE).exists()


def test_a_state_file_naming_checkpoints_outside_is_not_followed(tpurun_cli, model_dir, outside):
    """TensorFlow's manager deletes old checkpoints by the paths the state file lists."""
    for name in ("ckpt-1.index", "ckpt-1.data-00000-of-00001"):
        shutil.copy(model_dir / name.replace("ckpt-1", "ckpt-10"), outside / name)
    listed = [str(outside / "ckpt-1"), "ckpt-10", "ckpt-20"]
    (model_dir / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-20"\n'
        + "".join(f'all_model_checkpoint_paths: "{p}"\n' for p in listed)
    )
    result = train_to_30(tpurun_cli, model_dir, "--keep_checkpoint_max=1")
    assert_ok(result)
    assert "names " + str(outside / "ckpt-1") in result.stderr  # the warning says why
    assert (outside / "ckpt-1.index").exists() and (outside / "ckpt-1.data-00000-of-00001").exists()
    assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == ["ckpt-30.index"]


def test_a_linked_directory_tpurun_writes_into_is_refused(tpurun_cli, model_dir, outside):
    shutil.rmtree(model_dir / "eval", ignore_errors=True)
    (model_dir / "eval").symlink_to(outside, target_is_directory=True)
    result = tpurun_cli("eval", "--config=iris", f"--model_dir={model_dir}")
    assert_fails(result, RUN_FAILURE, "eval is a symbolic link", "writes only inside --model_dir")
    assert untouched(outside)


def test_a_step_whose_best_update_was_refused_is_offered_to_best_again(
    tpurun_cli, model_dir, outside
):
    """The results file marks a step evaluated: it is written only once best/ saw the step."""
    (model_dir / "best").symlink_to(outside, target_is_directory=True)
    result = tpurun_cli("eval", "--config=iris", f"--model_dir={model_dir}")
    assert_fails(result, RUN_FAILURE, "best is a symbolic link")
    assert untouched(outside)
    assert not (model_dir / "eval" / "test" / "results-20.json").exists()
    (model_dir / "best").unlink()
    sidecar = ("--continuous", "--train_steps=20", "--eval_timeout=2")
    result = assert_ok(tpurun_cli("eval", "--config=iris", f"--model_dir={model_dir}", *sidecar))
    assert "eval at step 20 on test: " in result.stdout
    # Step 20 was offered to best/: kept, or compared with the best so far and not.
    assert re.search(
        r"New best checkpoint: step 20,|Best checkpoint stays .*; step 20 has", result.stderr
    )
    assert json.loads((model_dir / "best" / "best.json").read_text())["step"] in (10, 20)


def test_a_linked_damaged_directory_is_refused_before_moving_anything(
    tpurun_cli, model_dir, outside
):
    (model_dir / "damaged").symlink_to(outside, target_is_directory=True)
    (model_dir / "ckpt-20.index").write_bytes(b"not an index")
    result = train_to_30(tpurun_cli, model_dir)
    assert_fails(result, RUN_FAILURE, "damaged is a symbolic link")
    assert untouched(outside)
    assert (model_dir / "ckpt-20.index").exists()  # nothing moved through the link


# --- damaged checkpoints: the fallback trains on -------------------------------------------


def damage_data(where: str):
    def damage(model_dir: Path) -> None:
        (data,) = model_dir.glob("ckpt-20.data-*")
        content = bytearray(data.read_bytes())
        start = {"start": 0, "middle": len(content) // 2, "end": len(content) - 50}[where]
        content[start : start + 50] = bytes(b ^ 0xFF for b in content[start : start + 50])
        data.write_bytes(bytes(content))

    return damage


def truncate_index(model_dir: Path) -> None:
    index = model_dir / "ckpt-20.index"
    index.write_bytes(index.read_bytes()[:40])


def remove_data_shard(model_dir: Path) -> None:
    for data in model_dir.glob("ckpt-20.data-*"):
        data.unlink()


@pytest.mark.parametrize(
    "damage",
    # One case per way a restore fails: a tensor's bytes that fail their checksum (where in
    # the data file does not matter: every tensor is checked alike), an index that does not
    # parse, a data file that is not there.
    [damage_data("middle"), truncate_index, remove_data_shard],
    ids=["data_middle", "truncated_index", "missing_data_shard"],
)
def test_a_damaged_newest_checkpoint_falls_back_and_trains_on(
    tpurun_cli, model_dir, uninterrupted, damage
):
    damage(model_dir)
    result = assert_ok(train_to_30(tpurun_cli, model_dir))
    assert "Resuming from" in result.stderr and "ckpt-10 (step 10)" in result.stderr
    # As if ckpt-10 were the newest: the resumed run ends where an uninterrupted one does.
    assert_bit_identical(model_dir / "ckpt-30", uninterrupted)
    result = assert_ok(tpurun_cli("eval", "--config=iris", f"--model_dir={model_dir}"))
    assert "eval at step 30" in result.stdout


# --- damaged records -----------------------------------------------------------------


def test_a_damaged_state_file_is_rebuilt_from_the_checkpoints(tpurun_cli, model_dir, uninterrupted):
    # Text that does not parse as a state; a file that is not text at all fails in the record
    # reader before (tests/test_storage.py, a damaged record [binary]), as DamagedRecord too.
    content = b"model_checkpoint_path: {{{"
    (model_dir / "checkpoint").write_bytes(content)
    result = assert_ok(train_to_30(tpurun_cli, model_dir))
    assert "checkpoint is damaged" in result.stderr
    assert_bit_identical(model_dir / "ckpt-30", uninterrupted)
    assert 'model_checkpoint_path: "ckpt-30"' in (model_dir / "checkpoint").read_text()


def test_a_damaged_best_record_is_set_aside_and_the_best_rebuilt(tpurun_cli, model_dir, outside):
    """A record that names a path outside; a truncated one fails in the record reader before
    (tests/test_storage.py) and is rebuilt alike (test_look_alikes_and_damaged_records_on_ram)."""
    record = json.dumps(
        {
            "step": 1,
            "metric": "accuracy",
            "mode": "max",
            "value": 0.5,
            "checkpoint": "../../outside/ckpt-1",
        }
    )
    (model_dir / "best").mkdir(exist_ok=True)
    (model_dir / "best" / "best.json").write_text(record)
    result = assert_ok(train_to_30(tpurun_cli, model_dir, "--eval_every=10"))
    assert "best.json is damaged" in result.stderr
    assert (model_dir / "damaged" / "best.json").read_text() == record
    kept = json.loads((model_dir / "best" / "best.json").read_text())
    assert kept["checkpoint"] == "ckpt-30"
    assert_ok(tpurun_cli("export", "--config=iris", f"--model_dir={model_dir}", "--best"))
    assert untouched(outside)


def test_a_damaged_train_config_names_the_file_and_the_way_on(tpurun_cli, model_dir):
    (model_dir / "train_config.json").write_text('{"config": ')
    result = train_to_30(tpurun_cli, model_dir)
    assert_fails(result, RUN_FAILURE, "train_config.json is damaged", "--force_resume")
    assert_ok(train_to_30(tpurun_cli, model_dir, "--force_resume"))
    assert json.loads((model_dir / "train_config.json").read_text())["__config_name__"] == "iris"


def test_a_model_dir_of_another_config_is_named_before_any_restore(tpurun_cli, model_dir):
    result = tpurun_cli("eval", "--config=mnist", f"--model_dir={model_dir}")
    assert_fails(result, USAGE, "trained with --config=iris (model iris)", "--config=mnist")


# --- the same on ram:// (no links there: names and records) ----------------------------


def test_look_alikes_and_damaged_records_on_ram(tpurun_cli, trained):
    import tensorflow as tf

    model_dir = f"ram://hostile-{os.getpid()}/model"
    for path in trained.rglob("*"):
        if path.is_file():
            target = f"{model_dir}/{path.relative_to(trained)}"
            tf.io.gfile.makedirs(target.rsplit("/", 1)[0])
            tf.io.gfile.copy(str(path), target, overwrite=True)
    for name, content in (
        ("ckpt-notes_template/notes.txt", SENTINEL),
        ("ckpt-old_temp.csv", SENTINEL),
        ("checkpoint", "garbage {{{"),
        ("best/best.json", '{"step": 1'),
    ):
        tf.io.gfile.makedirs(f"{model_dir}/{name}".rsplit("/", 1)[0])
        with tf.io.gfile.GFile(f"{model_dir}/{name}", "w") as f:
            f.write(content)
    assert_ok(train_to_30(tpurun_cli, model_dir, "--eval_every=10"))
    for name in ("ckpt-notes_template/notes.txt", "ckpt-old_temp.csv"):
        with tf.io.gfile.GFile(f"{model_dir}/{name}") as f:
            assert f.read() == SENTINEL
    with tf.io.gfile.GFile(f"{model_dir}/best/best.json") as f:
        assert json.loads(f.read())["step"] == 30
