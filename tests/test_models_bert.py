"""BERT through the CLI, against google-research/bert's TF1 graph and checkpoints (tests/bert_reference.py).

A tiny BERT (2 layers, 32 wide, 2 heads, 99 wordpieces, 16 tokens) is written as
google-research/bert publishes one (bert_model.ckpt by name, bert_config.json), with
records in create_pretraining_data's and run_classifier's formats, never by tpurun.
Then `eval --checkpoint` gives run_pretraining's metric_fn as the TF1 graph computes
it; pretraining and fine-tuning train, warm-started from the checkpoint (the
classifier head new); a run SIGKILLed inside a save resumes to the weights of one that
was not; 8 replicas train the weights of 1; run_classifier's padding examples change
no metric.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import bert_reference as reference
import forked
import numpy as np
import pytest
from conftest import OFFLINE_ENV, REPO, assert_ok
from test_resume import weights

pytestmark = pytest.mark.slow

NUM_LABELS = 3
STEPS = 20  # pretraining: two host loops of 10, a checkpoint after each


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> SimpleNamespace:
    """The checkpoint, its bert_config.json and the records, as google-research/bert's
    programs write them."""
    root = tmp_path_factory.mktemp("bert")
    prefix = reference.write_checkpoint(root / "uncased_L-2_H-32_A-2")
    examples = reference.write_pretraining_records(root / "pretrain.tfrecord", 24, seed=3)
    reference.write_classifier_records(root / "train.tfrecord", 32, 1, NUM_LABELS)
    # The same 13 real examples (the same draws, in order), then run_classifier's padding.
    reference.write_classifier_records(root / "dev.tfrecord", 13, 2, NUM_LABELS, padding=3)
    reference.write_classifier_records(root / "dev-real.tfrecord", 13, 2, NUM_LABELS)
    shape = (
        f"--config.bert_config_file={prefix.parent / 'bert_config.json'}",
        f"--config.max_seq_length={reference.SEQ_LENGTH}",
    )
    return SimpleNamespace(root=root, prefix=prefix, examples=examples, shape=shape)


def pretraining(published: SimpleNamespace) -> tuple[str, ...]:
    return (
        "--config=bert:tiny",
        "--use_tpu=false",
        *published.shape,
        f"--config.max_predictions_per_seq={reference.PREDICTIONS}",
        f"--config.data.train_files={published.root / 'pretrain.tfrecord'}",
        f"--config.data.eval_files={published.root / 'pretrain.tfrecord'}",
    )


def training(published: SimpleNamespace, model_dir: Path, shards: int = 1) -> tuple[str, ...]:
    """Pretraining, warm-started from the checkpoint: 20 steps of 8, saved every 10."""
    return (
        "train",
        *pretraining(published),
        f"--warm_start_from={published.prefix}",
        f"--num_shards={shards}",
        "--batch_size=8",
        f"--train_steps={STEPS}",
        "--iterations=10",
        "--save_checkpoints_steps=10",
        # A rate at which 20 steps move the weights well beyond float32 rounding.
        "--config.optimizer.learning_rate=0.01",
        f"--model_dir={model_dir}",
    )


@pytest.fixture(scope="module")
def trained(published, tmp_path_factory) -> SimpleNamespace:
    """The uninterrupted pretraining run on 1 replica (in this process)."""
    from conftest import tpurun_in_process

    model_dir = tmp_path_factory.mktemp("pretrained")
    result = assert_ok(tpurun_in_process(*training(published, model_dir)))
    return SimpleNamespace(model_dir=model_dir, stderr=result.stderr)


def test_eval_of_the_published_checkpoint_is_run_pretraining_metric_fn(
    tpurun_cli, published, tmp_path
):
    """run_pretraining --do_eval --init_checkpoint: the four metrics of the TF1 graph."""
    result = assert_ok(
        tpurun_cli(
            "eval", *pretraining(published), f"--checkpoint={published.prefix}",
            f"--model_dir={tmp_path}",
        )
    )  # fmt: skip
    assert "filled 30 of the model's 30 weights" in result.stderr
    (path,) = tmp_path.rglob("results-eval.json")
    got = json.loads(path.read_text())
    want = reference.pretraining_metrics(published.prefix, published.examples)
    assert got["num_examples"] == len(published.examples) and got["global_step"] == 1000
    for name, value in want.items():
        # float32 sums over 24 examples against float64: 1e-5 relative.
        assert got[name] == pytest.approx(value, rel=1e-5), name


def test_pretraining_records_train_warm_started_from_the_checkpoint(trained):
    assert "filled 30 of the model's 30 weights from 30 of the checkpoint's 31" in trained.stderr
    assert "left in the checkpoint: global_step" in trained.stderr
    losses = [float(x) for x in re.findall(r"step \d+/20 .*?masked_lm_loss (\S+)", trained.stderr)]
    assert len(losses) == 2 and all(np.isfinite(losses)), trained.stderr


def test_sigkill_inside_a_save_then_resume_is_bit_identical(
    tpurun_cli, published, trained, tmp_path
):
    """The tpurun process SIGKILLs itself inside its 2nd save (ckpt-20's merge): ckpt-10 is
    complete; the resumed run reads its records from batch 10 on and its dropout keys
    from step 10, and ends with the uninterrupted run's weights and Adam moments."""
    process = forked.Popen(
        [sys.executable, str(REPO / "tests" / "kill_inside_save.py"), "merge", "2",
         *training(published, tmp_path)],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # nothing of its process group survives
    resumed = assert_ok(tpurun_cli(*training(published, tmp_path))).stderr
    assert f"Resuming from {tmp_path / 'ckpt-10'}" in resumed
    first, second = weights(trained.model_dir / "ckpt-20"), weights(tmp_path / "ckpt-20")
    assert first.keys() == second.keys() and len(first) > 3 * 30
    differ = [name for name in first if not np.array_equal(first[name], second[name])]
    assert not differ, differ[:3]


def test_eight_replicas_train_the_weights_of_one(tpurun_cli, published, trained, tmp_path):
    """One example per replica: the masked LM's weights summed over all of them, the
    dropout drawn per example of the global batch, the gradients clipped after the sum."""
    result = assert_ok(tpurun_cli(*training(published, tmp_path, shards=8)))
    assert "8 logical CPU replicas" in result.stderr
    one, eight = weights(trained.model_dir / "ckpt-20"), weights(tmp_path / "ckpt-20")
    assert one.keys() == eight.keys()
    floats = [k for k in one if np.asarray(one[k]).dtype.kind == "f"]
    assert len(floats) >= 3 * 30  # the weights and their two Adam moments
    worst = max(float(np.max(np.abs(one[k] - eight[k]))) for k in floats)
    # After 20 steps of 0.01 the weights moved by ~0.1: float32 sums in another order.
    assert worst < 2e-5, worst


@pytest.fixture(scope="module")
def fine_tuned(published, tmp_path_factory) -> SimpleNamespace:
    """run_classifier's records fine-tuned from the checkpoint: 3 epochs of 32 at batch 8."""
    from conftest import tpurun_in_process

    model_dir = tmp_path_factory.mktemp("fine-tuned")
    result = tpurun_in_process(
        "train", "--config=bert_classifier:tiny", "--use_tpu=false", *published.shape,
        f"--config.num_labels={NUM_LABELS}",
        f"--config.data.train_files={published.root / 'train.tfrecord'}",
        "--config.data.train_examples=32", "--batch_size=8", "--iterations=6",
        f"--warm_start_from={published.prefix.parent}", f"--model_dir={model_dir}",
    )  # fmt: skip
    return SimpleNamespace(model_dir=model_dir, stderr=assert_ok(result).stderr)


def test_classifier_records_fine_tune_from_the_checkpoint_with_a_new_head(fine_tuned):
    log = fine_tuned.stderr
    assert "filled 23 of the model's 25 weights" in log
    assert "kept as built (config.train.warm_start_vars leaves them out): " in log
    assert "classifier/output_weights, classifier/output_bias" in log
    assert "--train_epochs=3: 12 steps" in log and "Saved checkpoint" in log


def test_padding_examples_change_no_metric(tpurun_cli, published, fine_tuned):
    """An eval over run_classifier's padded dev file equals the eval over its real examples."""
    results = {}
    for name in ("dev", "dev-real"):
        result = assert_ok(
            tpurun_cli(
                "eval", "--config=bert_classifier:tiny", "--use_tpu=false",
                f"--model_dir={fine_tuned.model_dir}",
                f"--config.data.eval_files={published.root / f'{name}.tfrecord'}",
            )
        )  # fmt: skip
        line = [x for x in result.stdout.splitlines() if x.startswith("eval at step 12")]
        results[name] = line
    assert results["dev"] == results["dev-real"] and "(13 examples)" in results["dev"][0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"max_seq_length": 32},
            "input_ids holds 16 values, not max_seq_length=32: set "
            "--config.max_seq_length=16 (the length the records were written with)",
        ),
        (
            {"max_predictions_per_seq": 2},
            "masked_lm_positions holds 4 values, not "
            "max_predictions_per_seq=2: set --config.max_predictions_per_seq=4",
        ),
        ({"bert": {"vocab_size": 50}}, "input_ids holds"),
    ],
    ids=["length", "predictions", "vocab"],
)
def test_records_of_another_shape_are_named_with_the_fix(published, override, message):
    """After a run fails on its records, the model names the first bad one (file, record)."""
    import ml_collections
    from tpurun.configs import bert as bert_config
    from tpurun.models import bert

    from tpurun.model import Mode

    config = bert_config.get_config("tiny")
    config.bert.update(reference.SHAPE)
    config.max_seq_length, config.max_predictions_per_seq = (
        reference.SEQ_LENGTH,
        reference.PREDICTIONS,
    )
    config.data.train_files = str(published.root / "pretrain.tfrecord")
    for key, value in override.items():
        if isinstance(value, dict):
            config[key].update(value)
        else:
            config[key] = value
    found = bert.BertPretraining(ml_collections.FrozenConfigDict(config)).diagnose_data(Mode.TRAIN)
    assert found and found.startswith(f"data file {published.root / 'pretrain.tfrecord'}, record ")
    assert message in found


def test_export_serves_int_ids_and_returns_probabilities(tpurun_cli, published, fine_tuned):
    import tensorflow as tf

    assert_ok(
        tpurun_cli(
            # No data: the model knows its inputs' spec (int32 ids of max_seq_length).
            "export", "--config=bert_classifier:tiny", "--use_tpu=false",
            f"--model_dir={fine_tuned.model_dir}", "--config.data.train_files=",
        )
    )  # fmt: skip
    (exported,) = (fine_tuned.model_dir / "export").iterdir()
    serve = tf.saved_model.load(str(exported)).signatures["serving_default"]
    ids = tf.constant([[2, 5, 6, 3] + [0] * 12, [2, 7, 3, 8, 3] + [0] * 11], tf.int32)
    inputs = {"input_ids": ids, "input_mask": tf.cast(ids > 0, tf.int32)}
    served = serve(**inputs, segment_ids=tf.zeros_like(ids))
    assert served["probabilities"].shape == (2, NUM_LABELS)
    np.testing.assert_allclose(tf.reduce_sum(served["probabilities"], -1), 1.0, rtol=1e-6)


def test_check_traces_pretraining_on_eight_replicas_and_prints_the_mapping(tpurun_cli, published):
    """The shipped bert config passes check's TPU rules on a v3-8's replicas, warm-started
    from the published checkpoint: the mapping said, as train says it, before the trace."""
    result = assert_ok(
        tpurun_cli(
            "check", *pretraining(published), "--batch_size=64", "--num_shards=8",
            f"--warm_start_from={published.prefix}",
        )
    )  # fmt: skip
    said = result.stdout
    assert re.search(r"filled (\d+) of the model's \1 weights", said), said[:400]
    assert "left in the checkpoint: global_step\n" in said and "cls/seq_relationship" in said
    assert "tpurun check: clean: the train, eval and predict steps of bert traced" in said


def test_export_of_the_published_checkpoint_needs_no_records(tpurun_cli, published, tmp_path):
    """export --checkpoint=bert_model.ckpt without a data file: run_pretraining's model,
    its masked LM's and next sentence's outputs served from the ids."""
    import tensorflow as tf

    result = assert_ok(
        tpurun_cli(
            "export", "--config=bert:tiny", "--use_tpu=false", *published.shape,
            f"--config.max_predictions_per_seq={reference.PREDICTIONS}",
            f"--checkpoint={published.prefix}", f"--model_dir={tmp_path}",
        )
    )  # fmt: skip
    serve = tf.saved_model.load(result.stdout.strip()).signatures["serving_default"]
    inputs = serve.structured_input_signature[1]
    assert sorted(inputs) == [
        "input_ids", "input_mask", "masked_lm_positions", "segment_ids",
    ]  # fmt: skip
    assert inputs["input_ids"].shape.as_list() == [None, reference.SEQ_LENGTH]
    assert all(spec.dtype == tf.int32 for spec in inputs.values())
    # Served on two of the records' examples: every output per example, and finite.
    served = serve(
        **{k: tf.constant([e[k] for e in published.examples[:2]], tf.int32) for k in inputs}
    )
    assert served and all(v.shape[0] == 2 for v in served.values()), served
    assert all(np.all(np.isfinite(v.numpy())) for v in served.values())
