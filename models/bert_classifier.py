"""BERT fine-tuning as google-research/bert's run_classifier.py ran it on TPUEstimator.

The network is modeling.py's (`bert_modeling`), then run_classifier's create_model:
dropout 0.1 on the pooled output, logits = pooled x output_weights^T + output_bias
(output_weights [num_labels, hidden], new: not in a pretrained checkpoint). The loss
is the softmax cross-entropy of `label_ids`; the recipe is run_classifier's
(configs/bert_classifier.py: lr 2e-5, 10% warmup, 3 epochs).

Records: run_classifier's (`bert_records`), as file_based_convert_examples_to_features
or `python -m tpurun.models.bert_text` writes them. An example with `is_real_example` 0
(the padding run_classifier adds so that TPU batches fill) weighs nothing: training
multiplies its loss by 0; eval and predict leave it out of the stream, and the launcher
pads the last batch itself (masked out), so eval is exact and predict gives one row per
real example, as run_classifier's output did.

Eval: `accuracy` and `loss` (run_classifier's eval_accuracy and eval_loss). Predict and
export take `input_ids`, `input_mask`, `segment_ids` (int32 [batch, max_seq_length]) and
give `probabilities` (and `class_ids`).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from tpurun.models import bert_modeling, bert_records
from tpurun.models.bert import BertModel, WeightedMean

from tpurun.model import Classifier, InputParams, Mode, register

LABEL_KEYS = ("label_ids", bert_records.IS_REAL)


@register("bert_classifier")
class BertClassifier(BertModel, Classifier):
    """run_classifier.py's model: BERT's pooled output -> num_labels logits."""

    writer = bert_records.CLASSIFIER_WRITER

    def _spec(self) -> dict[str, Any]:
        return bert_records.classifier_spec(self.config.max_seq_length)

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        def split(parsed: dict[str, tf.Tensor]) -> tuple[dict, dict]:
            features = {key: parsed[key] for key in self.feature_keys}
            return features, {key: parsed[key] for key in LABEL_KEYS}

        keep = None if mode is Mode.TRAIN else bert_records.is_real_example
        return self._dataset(mode, params, self._spec(), split, keep)

    def build(self) -> keras.Model:
        shape = self.bert_shape
        inputs = self._sequence_inputs()
        _, pooled = bert_modeling.Bert(shape)(
            inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"]
        )
        head = bert_modeling.ClassifierHead(
            shape, self.config.num_labels, self.config.classifier_dropout
        )
        return keras.Model(inputs, head(pooled), name="bert_classifier")

    def loss(self, labels: Any, outputs: tf.Tensor) -> tf.Tensor:
        """Each example's cross-entropy, times its is_real_example (0: padding)."""
        loss = super().loss(labels["label_ids"], outputs)
        return loss * tf.cast(labels[bert_records.IS_REAL], loss.dtype)

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"accuracy": WeightedMean(_correct, bert_records.IS_REAL)}

    def _bounds(self) -> dict[str, tuple[str, int]]:
        return {
            **super()._bounds(),
            "label_ids": ("num_labels", self.config.num_labels),
            bert_records.IS_REAL: ("2 (0 or 1)", 2),
        }

    def diagnose_data(self, mode: Mode) -> str | None:
        return self._diagnose(mode, self._spec())


def _correct(labels: Any, outputs: tf.Tensor) -> tf.Tensor:
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
    return tf.cast(tf.equal(predicted, labels["label_ids"]), tf.float32)
