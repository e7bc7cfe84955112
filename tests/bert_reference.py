"""google-research/bert in TF1 graph mode, written here from its published math, never with tpurun.

* `write_checkpoint`: a BERT's variables created by name with tf.compat.v1.get_variable
  in modeling.py's variable scopes (bert/embeddings/..., bert/encoder/layer_N/...,
  bert/pooler/dense, cls/predictions/..., cls/seq_relationship/...), random, saved by a
  name-based tf.compat.v1.train.Saver as `bert_model.ckpt` (with `global_step`), beside
  its bert_config.json;
* `pretraining_metrics`: run_pretraining.py's model_fn (modeling.py's forward pass, the
  masked LM and next-sentence heads) in a graph restored from such a checkpoint, over
  records, and its metric_fn's four values;
* `classifier_outputs`: run_classifier.py's create_model (the probabilities) likewise;
* `write_pretraining_records` / `write_classifier_records`: create_pretraining_data.py's
  and run_classifier.py's tf.train.Example formats.

TF 2.21 has no tf.compat.v1.layers without tf-keras: dense layers and layer_norm are
written out (tf.layers.dense's kernel/bias; tf.contrib.layers.layer_norm's moments,
beta/gamma and epsilon 1e-12).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

SHAPE = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 37,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
SEQ_LENGTH = 16
PREDICTIONS = 4


def _dense(x, units, name, activation=None, stddev=0.02):
    """tf.layers.dense: <name>/kernel [in, units], <name>/bias [units]."""
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "kernel",
            [x.shape[-1], units],
            initializer=v1.truncated_normal_initializer(stddev=stddev),
        )
        # Random biases (published checkpoints have trained ones), so a bias that is read
        # wrong shows.
        bias = v1.get_variable("bias", [units], initializer=v1.random_normal_initializer(0.0, 0.1))
    y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
    return activation(y) if activation else y


def _layer_norm(x):
    """tf.contrib.layers.layer_norm(begin_norm_axis=-1): LayerNorm/{beta,gamma}, epsilon 1e-12."""
    with v1.variable_scope("LayerNorm"):
        width = x.shape[-1]
        beta = v1.get_variable("beta", [width], initializer=v1.random_normal_initializer(0.0, 0.1))
        gamma = v1.get_variable(
            "gamma", [width], initializer=v1.random_normal_initializer(1.0, 0.1)
        )
    mean, variance = tf.nn.moments(x, [-1], keepdims=True)
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, variance_epsilon=1e-12)


def gelu(x):
    cdf = 0.5 * (1.0 + tf.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3))))
    return x * cdf


def bert_forward(shape, input_ids, input_mask, segment_ids):
    """modeling.py's BertModel (is_training=False): (sequence_output, pooled, word table)."""
    batch, seq = input_ids.shape
    width, heads = shape["hidden_size"], shape["num_attention_heads"]
    head_size = width // heads
    init = v1.truncated_normal_initializer(stddev=shape["initializer_range"])
    with v1.variable_scope("bert"):
        with v1.variable_scope("embeddings"):
            table = v1.get_variable(
                "word_embeddings", [shape["vocab_size"], width], initializer=init
            )
            output = tf.reshape(tf.gather(table, tf.reshape(input_ids, [-1])), [batch, seq, width])
            types = v1.get_variable(
                "token_type_embeddings", [shape["type_vocab_size"], width], initializer=init
            )
            one_hot = tf.one_hot(tf.reshape(segment_ids, [-1]), depth=shape["type_vocab_size"])
            output += tf.reshape(tf.matmul(one_hot, types), [batch, seq, width])
            positions = v1.get_variable(
                "position_embeddings", [shape["max_position_embeddings"], width], initializer=init
            )
            output += tf.reshape(tf.slice(positions, [0, 0], [seq, -1]), [1, seq, width])
            output = _layer_norm(output)
        with v1.variable_scope("encoder"):
            mask = tf.ones([batch, seq, 1]) * tf.cast(
                tf.reshape(input_mask, [batch, 1, seq]), tf.float32
            )
            adder = (1.0 - tf.expand_dims(mask, 1)) * -10000.0
            x = tf.reshape(output, [-1, width])
            for index in range(shape["num_hidden_layers"]):
                with v1.variable_scope(f"layer_{index}"):
                    x = _transformer_layer(x, adder, shape, batch, seq, heads, head_size)
        sequence_output = tf.reshape(x, [batch, seq, width])
        with v1.variable_scope("pooler"):
            pooled = _dense(tf.squeeze(sequence_output[:, 0:1, :], axis=1), width, "dense", tf.tanh)
    return sequence_output, pooled, table


def _transformer_layer(x, adder, shape, batch, seq, heads, head_size):
    width = shape["hidden_size"]
    act = {"gelu": gelu, "relu": tf.nn.relu, "tanh": tf.tanh}[shape["hidden_act"]]

    def for_scores(t):
        return tf.transpose(tf.reshape(t, [batch, seq, heads, head_size]), [0, 2, 1, 3])

    with v1.variable_scope("attention"):
        with v1.variable_scope("self"):
            query = for_scores(_dense(x, width, "query"))
            key = for_scores(_dense(x, width, "key"))
            value = for_scores(_dense(x, width, "value"))
            scores = tf.matmul(query, key, transpose_b=True) * (1.0 / math.sqrt(float(head_size)))
            probs = tf.nn.softmax(scores + adder)
            context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
            context = tf.reshape(context, [batch * seq, width])
        with v1.variable_scope("output"):
            attention = _layer_norm(_dense(context, width, "dense") + x)
    with v1.variable_scope("intermediate"):
        intermediate = _dense(attention, shape["intermediate_size"], "dense", act)
    with v1.variable_scope("output"):
        return _layer_norm(_dense(intermediate, width, "dense") + attention)


def pretraining_heads(shape, sequence_output, pooled, table, positions):
    """run_pretraining.py's get_masked_lm_output / get_next_sentence_output: log-probs."""
    batch, seq, width = sequence_output.shape
    flat = tf.reshape(sequence_output, [batch * seq, width])
    offsets = tf.reshape(tf.range(0, batch, dtype=tf.int32) * seq, [-1, 1])
    gathered = tf.gather(flat, tf.reshape(positions + offsets, [-1]))
    act = {"gelu": gelu, "relu": tf.nn.relu, "tanh": tf.tanh}[shape["hidden_act"]]
    with v1.variable_scope("cls/predictions"):
        with v1.variable_scope("transform"):
            hidden = _layer_norm(_dense(gathered, width, "dense", act))
        bias = v1.get_variable(
            "output_bias", [shape["vocab_size"]], initializer=v1.random_normal_initializer(0.0, 0.1)
        )
        mlm = tf.nn.log_softmax(tf.nn.bias_add(tf.matmul(hidden, table, transpose_b=True), bias))
    with v1.variable_scope("cls/seq_relationship"):
        weights = v1.get_variable(
            "output_weights", [2, width], initializer=v1.truncated_normal_initializer(stddev=0.02)
        )
        nsp_bias = v1.get_variable(
            "output_bias", [2], initializer=v1.random_normal_initializer(0.0, 0.1)
        )
        nsp = tf.nn.log_softmax(
            tf.nn.bias_add(tf.matmul(pooled, weights, transpose_b=True), nsp_bias)
        )
    return mlm, nsp


def write_checkpoint(directory: Path, shape: dict = SHAPE, seed: int = 1) -> Path:
    """A pretrained BERT as google-research/bert publishes one: bert_model.ckpt (name-based,
    with global_step) and bert_config.json in `directory`; returns the checkpoint prefix."""
    directory.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        v1.set_random_seed(seed)
        ids = tf.zeros([1, SEQ_LENGTH], tf.int32)
        sequence_output, pooled, table = bert_forward(shape, ids, ids, ids)
        pretraining_heads(shape, sequence_output, pooled, table, tf.zeros([1, 1], tf.int32))
        v1.train.get_or_create_global_step()
        saver = v1.train.Saver()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.assign(v1.train.get_global_step(), 1000))
            prefix = saver.save(session, str(directory / "bert_model.ckpt"), write_meta_graph=False)
    (directory / "bert_config.json").write_text(json.dumps(shape, indent=2))
    return Path(prefix)


def _int_feature(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def write_pretraining_records(
    path: Path, count: int, seed: int, shape: dict = SHAPE, seq: int = SEQ_LENGTH,
    predictions: int = PREDICTIONS,
) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """create_pretraining_data.py's records: sequences of random length, 1..predictions
    masked positions (the rest padded with weight 0). Returns the features written."""
    rng = np.random.default_rng(seed)
    written = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            length = int(rng.integers(5, seq + 1))
            ids = np.zeros(seq, np.int64)
            ids[:length] = rng.integers(1, shape["vocab_size"], length)
            mask = (np.arange(seq) < length).astype(np.int64)
            segments = np.zeros(seq, np.int64)
            segments[int(rng.integers(1, length)) : length] = 1
            masked = int(rng.integers(1, min(predictions, length - 1) + 1))
            positions = np.zeros(predictions, np.int64)
            positions[:masked] = np.sort(rng.choice(np.arange(1, length), masked, replace=False))
            labels = np.zeros(predictions, np.int64)
            labels[:masked] = rng.integers(1, shape["vocab_size"], masked)
            weights = (np.arange(predictions) < masked).astype(np.float32)
            features = {
                "input_ids": ids, "input_mask": mask, "segment_ids": segments,
                "masked_lm_positions": positions, "masked_lm_ids": labels,
                "masked_lm_weights": weights,
                "next_sentence_labels": np.array([rng.integers(0, 2)], np.int64),
            }  # fmt: skip
            feature = {
                key: tf.train.Feature(float_list=tf.train.FloatList(value=value))
                if key == "masked_lm_weights"
                else _int_feature(value)
                for key, value in features.items()
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
            written.append(features)
    return written


def write_classifier_records(
    path: Path, count: int, seed: int, num_labels: int, padding: int = 0,
    shape: dict = SHAPE, seq: int = SEQ_LENGTH,
) -> None:  # fmt: skip
    """run_classifier.py's records: `count` real examples, then `padding` of its
    PaddingInputExample (all zeros, is_real_example 0)."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index in range(count + padding):
            real = index < count
            length = int(rng.integers(3, seq + 1)) if real else 0
            ids = np.zeros(seq, np.int64)
            ids[:length] = rng.integers(1, shape["vocab_size"], length)
            segments = np.zeros(seq, np.int64)
            if real:
                segments[int(rng.integers(1, length)) : length] = 1
            feature = {
                "input_ids": _int_feature(ids),
                "input_mask": _int_feature(np.arange(seq) < length),
                "segment_ids": _int_feature(segments),
                "label_ids": _int_feature([rng.integers(0, num_labels) if real else 0]),
                "is_real_example": _int_feature([int(real)]),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


def pretraining_metrics(prefix: Path, examples: list[dict[str, np.ndarray]], shape: dict = SHAPE):
    """run_pretraining.py's metric_fn over `examples`, from the TF1 graph restored from `prefix`:
    masked_lm_accuracy, masked_lm_loss (weighted), next_sentence_accuracy, next_sentence_loss."""
    stacked = {key: np.stack([e[key] for e in examples]) for key in examples[0]}
    batch = len(examples)
    with tf.Graph().as_default():
        inputs = {
            key: tf.constant(stacked[key].astype(np.int32))
            for key in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
        }
        sequence_output, pooled, table = bert_forward(
            shape, inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"]
        )
        mlm, nsp = pretraining_heads(
            shape, sequence_output, pooled, table, inputs["masked_lm_positions"]
        )
        with v1.Session() as session:
            v1.train.Saver(v1.trainable_variables()).restore(session, str(prefix))
            mlm_log_probs, nsp_log_probs = session.run([mlm, nsp])
    ids = stacked["masked_lm_ids"].reshape(-1)
    weights = stacked["masked_lm_weights"].reshape(-1).astype(np.float64)
    position_loss = -mlm_log_probs[np.arange(len(ids)), ids].astype(np.float64)
    correct = (mlm_log_probs.argmax(-1) == ids).astype(np.float64)
    labels = stacked["next_sentence_labels"].reshape(-1)
    nsp_loss = -nsp_log_probs[np.arange(batch), labels].astype(np.float64)
    return {
        "masked_lm_accuracy": float((weights * correct).sum() / weights.sum()),
        "masked_lm_loss": float((weights * position_loss).sum() / weights.sum()),
        "next_sentence_accuracy": float((nsp_log_probs.argmax(-1) == labels).mean()),
        "next_sentence_loss": float(nsp_loss.mean()),
    }
