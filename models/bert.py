"""BERT pretraining as google-research/bert's run_pretraining.py ran it on TPUEstimator.

The network is modeling.py's (`bert_modeling`), its variables named as its checkpoints
name them; the records are create_pretraining_data.py's (`bert_records`); the recipe
is optimization.py's (configs/bert.py). What run_pretraining computed:

* the masked LM: the encoder's outputs gathered at `masked_lm_positions`, cls/predictions'
  transform, logits against the tied word embeddings plus output_bias; its loss is
  sum(masked_lm_weights x per-position loss) / (sum(masked_lm_weights) + 1e-5);
* the next sentence: cls/seq_relationship on the pooled output; its loss the mean;
* the training loss their sum.

The masked LM's sum runs over the whole global batch here (the weights' sum is
all-reduced over the replicas): what run_pretraining computed on one device, so 1 and 8
replicas train the same model. On a TPU, run_pretraining took each core's own ratio
and CrossShardOptimizer summed the cores' gradients, each clipped alone (docs/bert.md).

Eval reports run_pretraining's metric_fn over one exact pass of the eval records:
`masked_lm_accuracy` and `masked_lm_loss` (weighted by masked_lm_weights),
`next_sentence_accuracy` and `next_sentence_loss`; `loss` is each example's
weighted masked-LM mean plus its next-sentence loss, averaged.

Predict and export take `input_ids`, `input_mask`, `segment_ids` and
`masked_lm_positions` (int32) and give `masked_lm_ids` (the most likely wordpiece at
each position) and `next_sentence_probabilities`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from absl import logging
from tpurun.models import bert_modeling, bert_records

from tpurun.model import InputParams, Mode, Model, Step, register
from tpurun.training_step import OPTIMIZER

FEATURE_KEYS = (*bert_records.SEQUENCE_KEYS, "masked_lm_positions")
LABEL_KEYS = ("masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
MLM_LOG_PROBS = "masked_lm_log_probs"
NSP_LOG_PROBS = "next_sentence_log_probs"
# run_pretraining's guard against a batch without a masked position.
WEIGHT_EPSILON = 1e-5


class BertModel(Model):
    """What the pretraining and the classifier models share: the shape, the records' files."""

    input_fn_seeks = True  # train_dataset starts at params.start_batch itself
    writer = bert_records.PRETRAINING_WRITER
    feature_keys: tuple[str, ...] = bert_records.SEQUENCE_KEYS  # what input_fn's features hold

    @functools.cached_property
    def bert_shape(self) -> bert_modeling.BertShape:
        """config.bert, with config.bert_config_file's values over it (said when they differ)."""
        path = self.config.bert_config_file
        from_file = bert_modeling.read_bert_config(path) if path else None
        changed = [
            f"{key}={value!r} (config.bert: {self.config.bert[key]!r})"
            for key, value in (from_file or {}).items()
            if self.config.bert[key] != value
        ]
        if changed:
            logging.info("config.bert_config_file=%s sets %s.", path, ", ".join(changed))
        return bert_modeling.bert_shape(self.config.bert, from_file)

    def _sequence_inputs(self) -> dict[str, Any]:
        length = self.config.max_seq_length
        return {
            key: keras.Input((length,), dtype="int32", name=key)
            for key in bert_records.SEQUENCE_KEYS
        }

    def predict_spec(self, params: InputParams) -> Any:
        """The int32 ids input_fn(PREDICT) yields, known from the records' spec without
        them: an export of a published or fine-tuned checkpoint needs no data files."""
        parsing = self._spec()
        return {
            key: tf.TensorSpec(
                [None, *parsing[key].shape],
                tf.int32 if parsing[key].dtype == tf.int64 else parsing[key].dtype,
                name=key,
            )
            for key in self.feature_keys
        }

    def _files(self, mode: Mode) -> list[str]:
        return bert_records.files_for(
            self.config.data, mode, self.config.predict.input, self.writer
        )

    def _dataset(
        self,
        mode: Mode,
        params: InputParams,
        spec: dict[str, Any],
        split: Callable[[dict[str, tf.Tensor]], Any],
        keep: Callable[[tf.Tensor], tf.Tensor] | None = None,
    ) -> tf.data.Dataset:
        parse = bert_records.parser(spec)
        files = self._files(mode)
        if mode is Mode.TRAIN:
            return bert_records.train_dataset(
                files, params, self.config.data, lambda s: split(parse(s))
            )
        batches = bert_records.one_pass(files, params, parse, keep)
        if mode is Mode.PREDICT:
            return batches.map(lambda features: split(features)[0])
        return batches.map(split)

    def _bounds(self) -> dict[str, tuple[str, int]]:
        shape = self.bert_shape
        return {
            "input_ids": ("vocab_size", shape.vocab_size),
            "input_mask": ("2 (0 or 1)", 2),
            "segment_ids": ("type_vocab_size", shape.type_vocab_size),
        }

    def _diagnose(self, mode: Mode, spec: dict[str, Any]) -> str | None:
        return bert_records.find_bad_record(self._files(mode), spec, self._bounds(), self.writer)


@register("bert")
class BertPretraining(BertModel):
    """run_pretraining.py's model: masked LM and next sentence on create_pretraining_data's records."""

    feature_keys = FEATURE_KEYS

    def _spec(self) -> dict[str, Any]:
        return bert_records.pretraining_spec(
            self.config.max_seq_length, self.config.max_predictions_per_seq
        )

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        def split(parsed: dict[str, tf.Tensor]) -> tuple[dict, dict]:
            return {k: parsed[k] for k in self.feature_keys}, {k: parsed[k] for k in LABEL_KEYS}

        return self._dataset(mode, params, self._spec(), split)

    def build(self) -> keras.Model:
        shape = self.bert_shape
        inputs = self._sequence_inputs()
        positions = keras.Input(
            (self.config.max_predictions_per_seq,), dtype="int32", name="masked_lm_positions"
        )
        bert = bert_modeling.Bert(shape)
        sequence_output, pooled = bert(
            inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"]
        )
        heads = bert_modeling.PretrainingHeads(shape, bert.word_embeddings)
        mlm, nsp = heads(sequence_output, pooled, positions)
        return keras.Model(
            {**inputs, "masked_lm_positions": positions},
            {MLM_LOG_PROBS: mlm, NSP_LOG_PROBS: nsp},
            name="bert_pretraining",
        )

    def train_step(self, step: Step, features: Any, labels: Any) -> dict[str, tf.Tensor]:
        weights = labels["masked_lm_weights"]
        # The global batch's sum of the weights: this replica's masked-LM share is its part
        # of run_pretraining's numerator over the whole batch's denominator.
        total_weight = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.reduce_sum(weights)
        )
        with tf.GradientTape() as tape:
            outputs = step.model(features, training=True)
            position_loss, _ = masked_lm_losses(outputs, labels)
            masked_lm = tf.reduce_sum(weights * position_loss) / (total_weight + WEIGHT_EPSILON)
            sentence_loss, _ = next_sentence_losses(outputs, labels)
            next_sentence = step.mean(sentence_loss)
            loss = masked_lm + next_sentence
        step.minimize(OPTIMIZER, tape, loss)
        return {"loss": loss, "masked_lm_loss": masked_lm, "next_sentence_loss": next_sentence}

    def eval_step(self, models: dict[str, keras.Model], features: Any, labels: Any) -> Any:
        """What metric_fn needs of each example, [batch, positions] and [batch]: not the log
        probabilities over the vocabulary, which the host would gather for nothing."""
        outputs = models[self.serving_model](features, training=False)
        position_loss, position_predictions = masked_lm_losses(outputs, labels)
        sentence_loss, sentence_predictions = next_sentence_losses(outputs, labels)
        weights = labels["masked_lm_weights"]
        example_mlm = tf.reduce_sum(weights * position_loss, axis=1) / (
            tf.reduce_sum(weights, axis=1) + WEIGHT_EPSILON
        )
        per_example = {
            "masked_lm_loss": position_loss,
            "masked_lm_predictions": position_predictions,
            "next_sentence_loss": sentence_loss,
            "next_sentence_predictions": sentence_predictions,
        }
        return labels, per_example, example_mlm + sentence_loss

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        """run_pretraining.py's metric_fn."""
        return {
            "masked_lm_accuracy": WeightedMean(_masked_lm_correct, "masked_lm_weights"),
            "masked_lm_loss": WeightedMean(_value("masked_lm_loss"), "masked_lm_weights"),
            "next_sentence_accuracy": WeightedMean(_next_sentence_correct),
            "next_sentence_loss": WeightedMean(_value("next_sentence_loss")),
        }

    def predictions(self, outputs: Any) -> dict[str, tf.Tensor]:
        return {
            "masked_lm_ids": tf.argmax(outputs[MLM_LOG_PROBS], axis=-1, output_type=tf.int32),
            "next_sentence_probabilities": tf.exp(outputs[NSP_LOG_PROBS]),
        }

    def _bounds(self) -> dict[str, tuple[str, int]]:
        vocab = ("vocab_size", self.bert_shape.vocab_size)
        return {
            **super()._bounds(),
            "masked_lm_positions": ("max_seq_length", self.config.max_seq_length),
            "masked_lm_ids": vocab,
            "next_sentence_labels": ("2 (0 or 1)", 2),
        }

    def diagnose_data(self, mode: Mode) -> str | None:
        return self._diagnose(mode, self._spec())


def masked_lm_losses(outputs: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """Each masked position's loss (-log p of its wordpiece) and prediction, [batch, positions]."""
    log_probs = tf.cast(outputs[MLM_LOG_PROBS], tf.float32)
    ids = labels["masked_lm_ids"]
    one_hot = tf.one_hot(ids, depth=log_probs.shape[-1], dtype=tf.float32)
    loss = -tf.reduce_sum(log_probs * one_hot, axis=-1)
    return loss, tf.argmax(log_probs, axis=-1, output_type=tf.int32)


def next_sentence_losses(outputs: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """Each example's next-sentence loss and prediction, [batch]."""
    log_probs = tf.cast(outputs[NSP_LOG_PROBS], tf.float32)
    one_hot = tf.one_hot(labels["next_sentence_labels"][:, 0], depth=2, dtype=tf.float32)
    loss = -tf.reduce_sum(one_hot * log_probs, axis=-1)
    return loss, tf.argmax(log_probs, axis=-1, output_type=tf.int32)


def _value(key: str) -> Callable[[Any, Any], tf.Tensor]:
    return lambda labels, outputs: outputs[key]


def _masked_lm_correct(labels: Any, outputs: Any) -> tf.Tensor:
    return tf.cast(tf.equal(outputs["masked_lm_predictions"], labels["masked_lm_ids"]), tf.float32)


def _next_sentence_correct(labels: Any, outputs: Any) -> tf.Tensor:
    correct = tf.equal(outputs["next_sentence_predictions"], labels["next_sentence_labels"][:, 0])
    return tf.cast(correct, tf.float32)


class WeightedMean(keras.metrics.Metric):
    """tf.metrics.mean (or accuracy, of 0/1 values) with weights: sum(w x v) / sum(w).

    `value(labels, outputs)` gives [batch] or [batch, n] values; each is weighted by its
    example's mask (the launcher's padding: 0) times `labels[weight_key]` if given.
    """

    def __init__(
        self, value: Callable[[Any, Any], tf.Tensor], weight_key: str | None = None, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.value, self.weight_key = value, weight_key
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.weight = self.add_variable(shape=(), initializer="zeros", name="weight")

    def update_state(self, labels: Any, outputs: Any, sample_weight: Any = None) -> None:
        values = tf.cast(self.value(labels, outputs), tf.float32)
        weights = tf.ones_like(values)
        if sample_weight is not None:
            mask = tf.cast(sample_weight, tf.float32)
            weights *= tf.reshape(mask, [-1] + [1] * (values.shape.rank - 1))
        if self.weight_key:
            weights *= tf.cast(labels[self.weight_key], tf.float32)
        self.total.assign_add(tf.reduce_sum(weights * values))
        self.weight.assign_add(tf.reduce_sum(weights))

    def result(self) -> tf.Tensor:
        return tf.math.divide_no_nan(self.total, self.weight)

    def reset_state(self) -> None:
        self.total.assign(0.0)
        self.weight.assign(0.0)
