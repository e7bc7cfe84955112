"""Benchmark of BERT: the CPU-sized model's training in tpurun against Keras `fit`, and the converter.

1. Training examples/s of `configs/bert.py`'s `tiny` variant (BERT-Tiny: 2 layers, 128
   wide, 30,522 wordpieces, 128 tokens, 20 predictions, global batch 32), float32, 1
   replica, on create_pretraining_data-format records of random ids read by the model's
   own input_fn:

   * tpurun:    `Trainer.train(iterations)`, the real host loop running
                `BertPretraining.train_step` (run_pretraining's loss, the keyed dropout,
                AdamWeightDecay with clipping after the all-reduce);
   * keras fit: the same network (`model.build()`, whose KeyedDropout is Keras' Dropout
                outside tpurun's step) in a `keras.Model` whose train_step computes the
                same loss, compiled with the same optimizer (`model.optimizer()`) and
                `steps_per_execution` = iterations, Keras' default `jit_compile="auto"`
                (printed as it resolved), fitted on the same dataset.

   Both in one process, warmed up (two calls; the first traces), then in turns, repeat
   by repeat, so a change in the machine's load hits both alike; the median of
   `--repeats` reported, and every repeat's ratio (the noise).

2. Lines/s of the converter (`tpurun.models.bert_text`) against tokenization.py's
   FullTokenizer as tests/bert_tokenizer_reference.py restates it (pure Python, as the
   original): `--lines` synthetic TSV lines (two texts of 8-40 words, accents and
   punctuation among them) through (a) the tokenizer alone, both sides, and (b) the
   whole converter (pandas read, batch tokenization, truncation, records written).

Usage: `.venv/bin/python scripts/bench_bert.py [--steps=100 --repeats=3 --lines=100000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_wgan_gp import ITERATIONS, time_loops, tpurun_loop  # host loops of 50, as there
from offline_env import run_json_worker  # scripts/offline_env.py

REPO = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="steps timed per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; median reported")
    parser.add_argument(
        "--no_dropout", action="store_true", help="training: dropout 0 in both (its cost)"
    )
    parser.add_argument("--lines", type=int, default=100_000, help="converter: TSV lines")
    parser.add_argument("--reference_lines", type=int, default=20_000, help="FullTokenizer's")
    parser.add_argument("--worker", choices=("training", "converter"), help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        run = run_training if args.worker == "training" else run_converter
        print(json.dumps(run(args)))
        return
    with tempfile.TemporaryDirectory() as data_dir:
        common = [sys.executable, os.path.abspath(__file__), f"--data_dir={data_dir}"]
        found = run_json_worker(
            [*common, "--worker=training", f"--steps={args.steps}", f"--repeats={args.repeats}",
             *(["--no_dropout"] if args.no_dropout else [])]
        )  # fmt: skip
        text = run_json_worker(
            [*common, "--worker=converter", f"--lines={args.lines}",
             f"--reference_lines={args.reference_lines}"]
        )  # fmt: skip
    assert isinstance(found, dict) and isinstance(text, dict)
    dropout = " (dropout off)" if args.no_dropout else ""
    print(
        f"\nBERT-Tiny pretraining (configs/bert.py:tiny), global batch {found['batch']}, float32{dropout}"
    )
    print(f"{'loop':<40} {'examples/s':>12} {'per CPU-s':>10}")
    per_cpu = found["per_cpu"]
    print(
        f"{'tpurun (BertPretraining.train_step)':<40} {found['tpurun']:>12.1f} {per_cpu['tpurun']:>10.1f}"
    )
    fit = "keras fit (jit_compile=" + found["jit_compile"] + ")"
    print(f"{fit:<40} {found['fit']:>12.1f} {per_cpu['fit']:>10.1f}")
    ratios = ", ".join(f"{r:.2f}" for r in found["ratios"])
    print(f"\ntpurun / fit examples/s = {found['tpurun'] / found['fit']:.2f} (repeats: {ratios})")
    print(f"tpurun / fit examples per CPU-second = {per_cpu['tpurun'] / per_cpu['fit']:.2f}")
    print(f"\nconverter, {text['lines']:,} TSV lines (two texts each)")
    print(f"{'':<44} {'lines/s':>12}")
    print(f"{'FullTokenizer (reference), tokenize + ids':<44} {text['reference']:>12.0f}")
    print(f"{'tokenizers, encode_batch':<44} {text['tokenizers']:>12.0f}")
    print(f"{'tpurun.models.bert_text.convert, whole':<44} {text['converter']:>12.0f}")
    print(f"\ntokenizers / FullTokenizer = {text['tokenizers'] / text['reference']:.1f}x")


def write_records(path: str, count: int, seq: int, predictions: int, vocab: int) -> None:
    """create_pretraining_data's format, random ids (speed does not depend on them)."""
    import numpy as np
    import tensorflow as tf

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(count):
            feature = {
                "input_ids": ints(rng.integers(1, vocab, seq)),
                "input_mask": ints([1] * seq),
                "segment_ids": ints([0] * (seq // 2) + [1] * (seq - seq // 2)),
                "masked_lm_positions": ints(np.sort(rng.choice(seq, predictions, replace=False))),
                "masked_lm_ids": ints(rng.integers(1, vocab, predictions)),
                "masked_lm_weights": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[1.0] * predictions)
                ),
                "next_sentence_labels": ints([int(rng.integers(0, 2))]),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


def run_training(args: argparse.Namespace) -> dict:
    import keras

    from tpurun import model as model_lib
    from tpurun.cluster import strategy
    from tpurun.run_config import RunConfig, config_files, merge_flags

    config = config_files.load(config_files.resolve("bert:tiny"))
    records = os.path.join(args.data_dir, "pretrain.tfrecord")
    write_records(records, 512, config.max_seq_length, config.max_predictions_per_seq,
                  config.bert.vocab_size)  # fmt: skip
    config.data.train_files = records
    if args.no_dropout:
        config.bert.hidden_dropout_prob = config.bert.attention_probs_dropout_prob = 0.0
    config = merge_flags(config, {"iterations": ITERATIONS, "precision": "float32"})
    run = RunConfig("train", "bert", config, model_dir=tempfile.mkdtemp())
    cluster = strategy.build(run)
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(0)
    loops = {"tpurun": tpurun_loop(run, cluster, model), "fit": fit_loop(run, model)}
    seconds, cpu = time_loops(loops, args.steps, args.repeats)
    batch = run.train_batch_size
    per_second = {name: batch * args.steps / statistics.median(s) for name, s in seconds.items()}
    ratios = [f / t for t, f in zip(seconds["tpurun"], seconds["fit"], strict=True)]
    # Examples per CPU-second (all of the process's threads): what the load disturbs least.
    per_cpu = {name: batch * args.steps / statistics.median(s) for name, s in cpu.items()}
    jit = loops["fit"].jit_compile  # type: ignore[attr-defined]
    return {**per_second, "batch": batch, "jit_compile": jit, "ratios": ratios, "per_cpu": per_cpu}


def fit_loop(run, model):
    """`loop(steps)`: one `fit` call of `steps` steps of the same network, loss and optimizer."""
    import keras
    import tensorflow as tf
    from tpurun.models import bert

    from tpurun import inputs
    from tpurun.model import Mode

    network = model.build()

    class Pretraining(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def train_step(self, data):
            features, labels = data
            weights = labels["masked_lm_weights"]
            with tf.GradientTape() as tape:
                outputs = self.network(features, training=True)
                position_loss, _ = bert.masked_lm_losses(outputs, labels)
                masked_lm = tf.reduce_sum(weights * position_loss) / (
                    tf.reduce_sum(weights) + bert.WEIGHT_EPSILON
                )
                sentence_loss, _ = bert.next_sentence_losses(outputs, labels)
                loss = masked_lm + tf.reduce_mean(sentence_loss)
            variables = self.network.trainable_variables
            self.optimizer.apply_gradients(
                zip(tape.gradient(loss, variables), variables, strict=True)
            )
            return {"loss": loss}

    pretraining = Pretraining()
    pretraining.compile(optimizer=model.optimizer(), steps_per_execution=ITERATIONS)
    params = inputs.input_params(tf.distribute.InputContext(), run.train_batch_size, run.seed)
    dataset = model.input_fn(Mode.TRAIN, params)

    def loop(steps: int) -> None:
        pretraining.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)

    loop.jit_compile = str(pretraining.jit_compile)  # type: ignore[attr-defined]
    return loop


WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "café naïve résumé über coöperate façade piñata jalapeño déjà vu"
).split()


def run_converter(args: argparse.Namespace) -> dict:
    import numpy as np

    sys.path.insert(0, str(REPO / "tests"))
    import bert_tokenizer_reference as reference
    from tpurun.models import bert_text

    rng = np.random.default_rng(0)
    vocab_path = os.path.join(args.data_dir, "vocab.txt")
    pieces = {w[:k] for w in WORDS for k in range(1, len(w) + 1)}
    pieces |= {"##" + w[k:] for w in WORDS for k in range(1, len(w))}
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", ".", "!", "?", *sorted(pieces)]
    Path(vocab_path).write_text("\n".join(tokens) + "\n", encoding="utf-8")

    def sentence() -> str:
        words = rng.choice(WORDS, rng.integers(8, 41))
        return " ".join(w.capitalize() if rng.random() < 0.1 else w for w in words) + "."

    lines = [(sentence(), sentence(), str(rng.integers(0, 2))) for _ in range(args.lines)]
    source = os.path.join(args.data_dir, "train.tsv")
    with open(source, "w", encoding="utf-8") as f:
        f.write("text_a\ttext_b\tlabel\n")
        f.writelines("\t".join(line) + "\n" for line in lines)

    full = reference.FullTokenizer(vocab_path)
    start = time.perf_counter()
    for a, b, _ in lines[: args.reference_lines]:
        full.ids(a), full.ids(b)
    reference_rate = args.reference_lines / (time.perf_counter() - start)

    ours = bert_text.wordpiece_tokenizer(bert_text.load_vocab(vocab_path), lower_case=True)
    start = time.perf_counter()
    ours.encode_batch([a for a, _, _ in lines], add_special_tokens=False)
    ours.encode_batch([b for _, b, _ in lines], add_special_tokens=False)
    tokenizers_rate = len(lines) / (time.perf_counter() - start)

    start = time.perf_counter()
    bert_text.convert(source, os.path.join(args.data_dir, "train.tfrecord"), vocab_path)
    converter_rate = len(lines) / (time.perf_counter() - start)
    return {
        "lines": len(lines),
        "reference": reference_rate,
        "tokenizers": tokenizers_rate,
        "converter": converter_rate,
    }


if __name__ == "__main__":
    main()
