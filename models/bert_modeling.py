"""google-research/bert's modeling.py as Keras layers, each variable named as its checkpoints name it.

The math is modeling.py's, so a published `bert_model.ckpt` gives the numbers it gave
(tests/bert_reference.py is that math in TF1 graph mode, and the tests compare):

* embeddings: word + token type + position (the first seq_length rows), in that order,
  then LayerNorm and dropout;
* every layer: self-attention (query, key, value; scores scaled by 1/sqrt(head size);
  (1 - input_mask) x -10000 added before the softmax; dropout on the probabilities),
  a dense output, dropout, LayerNorm of it plus the layer's input; the intermediate
  dense with `hidden_act`; a dense output, dropout, LayerNorm of it plus the attention's;
* LayerNorm over the last axis with epsilon 1e-12 (tf.contrib.layers.layer_norm's);
* gelu as modeling.py computes it: 0.5 x (1 + tanh(sqrt(2/pi) x (x + 0.044715 x^3))) x;
* the pooler: a tanh dense layer on the first token's output;
* weights from a truncated normal of stddev `initializer_range`, biases zero.

The variables' paths (Keras' `variable.path`) are the TF1 names: the layers nest as
modeling.py's variable scopes do (`bert/encoder/layer_3/attention/self/query/kernel`,
`bert/embeddings/LayerNorm/gamma`, `cls/predictions/output_bias`), so the name map from
a TF1 checkpoint is the identity on them (configs/bert.py). Dropout is tpurun's
`KeyedDropout`: 1 and 8 replicas, and a resumed run, drop the same units.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import keras
import tensorflow as tf

from tpurun.errors import RunError, UsageError
from tpurun.model import KeyedDropout

# tf.contrib.layers.layer_norm's epsilon, which modeling.py's layer_norm takes.
LAYER_NORM_EPSILON = 1e-12
# What a masked attention score gets added (modeling.py's attention_layer).
MASKED_SCORE = -10000.0


def gelu(x: tf.Tensor) -> tf.Tensor:
    """modeling.py's gelu: the tanh approximation, computed in the same order."""
    cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
    return x * cdf


ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor] | None] = {
    "gelu": gelu,
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "linear": None,
}


@dataclasses.dataclass(frozen=True)
class BertShape:
    """A model's shape and dropout: the keys of a published bert_config.json."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    hidden_dropout_prob: float
    attention_probs_dropout_prob: float
    max_position_embeddings: int
    type_vocab_size: int
    initializer_range: float

    def __post_init__(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise UsageError(
                f"hidden_act={self.hidden_act!r} is not one of modeling.py's activations; "
                f"use one of {', '.join(ACTIVATIONS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise UsageError(
                f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads="
                f"{self.num_attention_heads}: each head takes hidden_size / heads"
            )


KEYS = tuple(field.name for field in dataclasses.fields(BertShape))


def read_bert_config(path: str) -> dict[str, Any]:
    """The keys of a bert_config.json (local or gs://), checked; a RunError says what is wrong."""
    try:
        with tf.io.gfile.GFile(path) as f:
            values = json.load(f)
    except (tf.errors.OpError, OSError) as e:
        raise RunError(f"config.bert_config_file={path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise RunError(f"config.bert_config_file={path}: not JSON ({e})") from None
    if not isinstance(values, dict):
        raise RunError(f"config.bert_config_file={path}: not a JSON object of bert_config keys")
    missing = [key for key in KEYS if key not in values]
    if missing:
        raise RunError(
            f"config.bert_config_file={path} has no {', '.join(missing)}: use the "
            "bert_config.json published with the checkpoint"
        )
    return {key: values[key] for key in KEYS}


def bert_shape(bert: Mapping[str, Any], values_from_file: Mapping[str, Any] | None) -> BertShape:
    """The shape of `config.bert`, with the values of config.bert_config_file over it."""
    values = {key: bert[key] for key in KEYS}
    values.update(values_from_file or {})
    return BertShape(**values)


def initializer(shape: BertShape) -> keras.initializers.Initializer:
    """modeling.py's create_initializer: a normal truncated at two standard deviations."""
    return keras.initializers.TruncatedNormal(stddev=shape.initializer_range)


def _dense(units: int, shape: BertShape, name: str, activation: Any = None) -> keras.layers.Dense:
    return keras.layers.Dense(
        units, activation=activation, kernel_initializer=initializer(shape), name=name
    )


def _layer_norm() -> keras.layers.LayerNormalization:
    return keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="LayerNorm")


class Embeddings(keras.layers.Layer):
    """bert/embeddings: word, token type and position embeddings summed, LayerNorm, dropout."""

    def __init__(self, shape: BertShape, **kwargs: Any):
        super().__init__(name="embeddings", **kwargs)
        self.bert_shape = shape
        self.layer_norm = _layer_norm()
        self.dropout = KeyedDropout(shape.hidden_dropout_prob, name="embeddings_dropout")

    def build(self, input_shape: Any) -> None:
        shape, width = self.bert_shape, self.bert_shape.hidden_size
        self.word_embeddings = self.add_weight(
            name="word_embeddings", shape=(shape.vocab_size, width), initializer=initializer(shape)
        )
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings",
            shape=(shape.type_vocab_size, width),
            initializer=initializer(shape),
        )
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(shape.max_position_embeddings, width),
            initializer=initializer(shape),
        )

    def call(self, input_ids: tf.Tensor, segment_ids: tf.Tensor, training: bool = False) -> Any:
        seq_length = input_ids.shape[1]
        if seq_length > self.bert_shape.max_position_embeddings:
            raise UsageError(
                f"sequences of {seq_length} tokens are longer than max_position_embeddings="
                f"{self.bert_shape.max_position_embeddings}: lower max_seq_length"
            )
        dtype = self.compute_dtype
        output = tf.gather(tf.cast(self.word_embeddings, dtype), input_ids)
        output += tf.gather(tf.cast(self.token_type_embeddings, dtype), segment_ids)
        output += tf.cast(self.position_embeddings, dtype)[:seq_length]
        return self.dropout(self.layer_norm(output), training=training)


class SelfAttention(keras.layers.Layer):
    """attention/self: multi-head scaled dot-product attention, the padding masked out."""

    def __init__(self, shape: BertShape, index: int, **kwargs: Any):
        super().__init__(name="self", **kwargs)
        self.heads = shape.num_attention_heads
        self.head_size = shape.hidden_size // shape.num_attention_heads
        self.query = _dense(shape.hidden_size, shape, "query")
        self.key = _dense(shape.hidden_size, shape, "key")
        self.value = _dense(shape.hidden_size, shape, "value")
        self.dropout = KeyedDropout(
            shape.attention_probs_dropout_prob, name=f"layer_{index}_attention_probs_dropout"
        )

    def _heads(self, x: tf.Tensor) -> tf.Tensor:
        """[batch, seq, hidden] -> [batch, heads, seq, head size]."""
        x = tf.reshape(x, [-1, x.shape[1], self.heads, self.head_size])
        return tf.transpose(x, [0, 2, 1, 3])

    def call(self, x: tf.Tensor, mask_adder: tf.Tensor, training: bool = False) -> tf.Tensor:
        query, key = self._heads(self.query(x)), self._heads(self.key(x))
        scores = tf.matmul(query, key, transpose_b=True)
        scores = tf.multiply(scores, 1.0 / math.sqrt(float(self.head_size)))
        # The mask and the softmax in float32 (as they are under float32 itself).
        probs = tf.nn.softmax(tf.cast(scores, tf.float32) + mask_adder)
        probs = self.dropout(tf.cast(probs, x.dtype), training=training)
        context = tf.matmul(probs, self._heads(self.value(x)))
        context = tf.transpose(context, [0, 2, 1, 3])
        return tf.reshape(context, [-1, x.shape[1], self.heads * self.head_size])


class DenseResidualNorm(keras.layers.Layer):
    """An `output` scope: dense, dropout, then LayerNorm of it plus the residual input."""

    def __init__(self, shape: BertShape, dropout_name: str, **kwargs: Any):
        super().__init__(name="output", **kwargs)
        self.dense = _dense(shape.hidden_size, shape, "dense")
        self.dropout = KeyedDropout(shape.hidden_dropout_prob, name=dropout_name)
        self.layer_norm = _layer_norm()

    def call(self, x: tf.Tensor, residual: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.layer_norm(self.dropout(self.dense(x), training=training) + residual)


class Attention(keras.layers.Layer):
    """layer_N/attention: `self` then `output`."""

    def __init__(self, shape: BertShape, index: int, **kwargs: Any):
        super().__init__(name="attention", **kwargs)
        self.self_attention = SelfAttention(shape, index)
        self.output_block = DenseResidualNorm(shape, f"layer_{index}_attention_output_dropout")

    def call(self, x: tf.Tensor, mask_adder: tf.Tensor, training: bool = False) -> tf.Tensor:
        heads = self.self_attention(x, mask_adder, training=training)
        return self.output_block(heads, x, training=training)


class Intermediate(keras.layers.Layer):
    """layer_N/intermediate: the wide dense layer with hidden_act."""

    def __init__(self, shape: BertShape, **kwargs: Any):
        super().__init__(name="intermediate", **kwargs)
        self.dense = _dense(
            shape.intermediate_size, shape, "dense", activation=ACTIVATIONS[shape.hidden_act]
        )

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return self.dense(x)


class TransformerLayer(keras.layers.Layer):
    """encoder/layer_N: attention, intermediate, output."""

    def __init__(self, shape: BertShape, index: int, **kwargs: Any):
        super().__init__(name=f"layer_{index}", **kwargs)
        self.attention = Attention(shape, index)
        self.intermediate = Intermediate(shape)
        self.output_block = DenseResidualNorm(shape, f"layer_{index}_output_dropout")

    def call(self, x: tf.Tensor, mask_adder: tf.Tensor, training: bool = False) -> tf.Tensor:
        attended = self.attention(x, mask_adder, training=training)
        return self.output_block(self.intermediate(attended), attended, training=training)


class Encoder(keras.layers.Layer):
    """bert/encoder: num_hidden_layers transformer layers over the masked sequence."""

    def __init__(self, shape: BertShape, **kwargs: Any):
        super().__init__(name="encoder", **kwargs)
        self.layers_ = [TransformerLayer(shape, i) for i in range(shape.num_hidden_layers)]

    def call(self, x: tf.Tensor, input_mask: tf.Tensor, training: bool = False) -> tf.Tensor:
        # (1 - mask) x -10000 for every query position: [batch, 1 (heads), 1 (from), seq (to)].
        mask_adder = (1.0 - tf.cast(input_mask, tf.float32)[:, None, None, :]) * MASKED_SCORE
        for layer in self.layers_:
            x = layer(x, mask_adder, training=training)
        return x


class Pooler(keras.layers.Layer):
    """bert/pooler: tanh(dense(the first token's output))."""

    def __init__(self, shape: BertShape, **kwargs: Any):
        super().__init__(name="pooler", **kwargs)
        self.dense = _dense(shape.hidden_size, shape, "dense", activation=tf.tanh)

    def call(self, sequence_output: tf.Tensor) -> tf.Tensor:
        return self.dense(sequence_output[:, 0])


class Bert(keras.layers.Layer):
    """The `bert` scope: (input_ids, input_mask, segment_ids) -> (sequence output, pooled)."""

    def __init__(self, shape: BertShape, **kwargs: Any):
        super().__init__(name="bert", **kwargs)
        self.embeddings = Embeddings(shape)
        self.encoder = Encoder(shape)
        self.pooler = Pooler(shape)

    def call(
        self,
        input_ids: tf.Tensor,
        input_mask: tf.Tensor,
        segment_ids: tf.Tensor,
        training: bool = False,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        embedded = self.embeddings(input_ids, segment_ids, training=training)
        sequence_output = self.encoder(embedded, input_mask, training=training)
        return sequence_output, self.pooler(sequence_output)

    def word_embeddings(self) -> Any:
        return self.embeddings.word_embeddings


class MaskedLMHead(keras.layers.Layer):
    """cls/predictions: transform (dense with hidden_act, LayerNorm), then logits against
    the word embeddings (tied) plus output_bias; log-softmax over the vocabulary."""

    def __init__(self, shape: BertShape, word_embeddings: Callable[[], Any], **kwargs: Any):
        super().__init__(name="predictions", **kwargs)
        self.bert_shape = shape
        self.transform = keras.Sequential(
            [
                _dense(shape.hidden_size, shape, "dense", ACTIVATIONS[shape.hidden_act]),
                _layer_norm(),
            ],
            name="transform",
        )
        # A function, not the variable: the table is the embeddings' (tracked there once).
        self.word_embeddings = word_embeddings

    def build(self, input_shape: Any) -> None:
        self.output_bias = self.add_weight(
            name="output_bias",
            shape=(self.bert_shape.vocab_size,),
            initializer="zeros",
            autocast=False,  # added to the float32 logits
        )

    def call(self, gathered: tf.Tensor) -> tf.Tensor:
        hidden = self.transform(gathered)
        table = tf.cast(self.word_embeddings(), hidden.dtype)
        logits = tf.matmul(hidden, table, transpose_b=True)
        logits = tf.cast(logits, tf.float32) + self.output_bias
        return tf.nn.log_softmax(logits, axis=-1)


class NextSentenceHead(keras.layers.Layer):
    """cls/seq_relationship: output_weights [2, hidden] (transposed against a Dense kernel),
    output_bias [2]; log-softmax of the two classes (0: B follows A, 1: B is random)."""

    def __init__(self, shape: BertShape, **kwargs: Any):
        super().__init__(name="seq_relationship", **kwargs)
        self.bert_shape = shape

    def build(self, input_shape: Any) -> None:
        self.output_weights = self.add_weight(
            name="output_weights",
            shape=(2, self.bert_shape.hidden_size),
            initializer=initializer(self.bert_shape),
        )
        self.output_bias = self.add_weight(
            name="output_bias", shape=(2,), initializer="zeros", autocast=False
        )

    def call(self, pooled: tf.Tensor) -> tf.Tensor:
        logits = tf.matmul(pooled, tf.cast(self.output_weights, pooled.dtype), transpose_b=True)
        return tf.nn.log_softmax(tf.cast(logits, tf.float32) + self.output_bias, axis=-1)


class PretrainingHeads(keras.layers.Layer):
    """The `cls` scope: the masked LM over the gathered positions, and the next sentence."""

    def __init__(self, shape: BertShape, word_embeddings: Callable[[], Any], **kwargs: Any):
        super().__init__(name="cls", **kwargs)
        self.predictions = MaskedLMHead(shape, word_embeddings)
        self.seq_relationship = NextSentenceHead(shape)

    def call(
        self, sequence_output: tf.Tensor, pooled: tf.Tensor, positions: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        gathered = tf.gather(sequence_output, positions, batch_dims=1)  # [batch, predictions, H]
        return self.predictions(gathered), self.seq_relationship(pooled)


class ClassifierHead(keras.layers.Layer):
    """run_classifier.py's head: dropout on the pooled output, then output_weights
    [num_labels, hidden] (transposed) and output_bias: the logits."""

    def __init__(self, shape: BertShape, num_labels: int, dropout: float, **kwargs: Any):
        super().__init__(name="classifier", **kwargs)
        self.bert_shape, self.num_labels = shape, num_labels
        self.dropout = KeyedDropout(dropout, name="classifier_dropout")

    def build(self, input_shape: Any) -> None:
        self.output_weights = self.add_weight(
            name="output_weights",
            shape=(self.num_labels, self.bert_shape.hidden_size),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),  # run_classifier's
        )
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.num_labels,), initializer="zeros", autocast=False
        )

    def call(self, pooled: tf.Tensor, training: bool = False) -> tf.Tensor:
        pooled = self.dropout(pooled, training=training)
        logits = tf.matmul(pooled, tf.cast(self.output_weights, pooled.dtype), transpose_b=True)
        return tf.cast(logits, tf.float32) + self.output_bias
