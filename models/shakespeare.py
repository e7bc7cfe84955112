"""Shakespeare: the character-level LSTM of the "Predict Shakespeare with Cloud TPUs and Keras" example.

Any text file is the data: its bytes are the vocabulary (ids 0..255, int32), so
there is no tokenizer and no vocabulary file. A training example is the window of
`seq_len + 1` bytes at one offset of the text (static shapes: the input is the
first `seq_len`, the target the last `seq_len`, i.e. the input shifted by one):
the text is the model's `train_arrays`, kept on the device, and every epoch
visits every offset once in a new order; eval takes the held-out text in
consecutive windows. The model is byte embedding ->
stacked LSTMs (returning sequences) -> dense logits over the 256 byte values; the
embedding is a one-hot matmul (`ByteEmbedding`), whose dense gradient suits a TPU.

`tpurun predict` generates text (`generate`): it feeds `--prompt` through the
trained cells and samples `config.predict.length` bytes at
`config.predict.temperature` (0 = always the likeliest byte). The exported
`serving_default` signature is the next-byte model: `ids` (int32 [batch, length],
any length) -> `next_char_ids`, `probabilities`, `logits` of the byte after the
last one.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tpurun.errors import RunError, UsageError
from tpurun.errors.tf_errors import one_line
from tpurun.model import InputParams, Mode, Model, TrainArrays, register

VOCAB = 256  # byte values
FEATURE = "ids"


def encode(text: str) -> np.ndarray:
    """UTF-8 bytes of `text` as int32 ids."""
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def decode(ids: np.ndarray) -> str:
    """Bytes back to text; a sampled byte sequence that is not valid UTF-8 gets U+FFFD."""
    return bytes(np.asarray(ids, np.uint8).tolist()).decode("utf-8", errors="replace")


def read_ids(path: str) -> np.ndarray:
    """The bytes of a text file (local or gs://) as int32 ids, or a RunError."""
    if not path:
        raise RunError(
            "no text: pass --config.data.path=<a text file>, e.g. tiny-shakespeare's input.txt "
            "(any local or gs:// file; its bytes are the vocabulary)"
        )
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError:
        raise RunError(f"text file {path} does not exist; check config.data.path") from None
    except tf.errors.OpError as e:
        raise RunError(f"cannot read text file {path}: {one_line(e)}") from None
    return np.frombuffer(data, np.uint8).astype(np.int32)


class ByteEmbedding(keras.layers.Layer):
    """Embedding of byte ids as a one-hot matmul, as TPU models do for small vocabularies.

    Same result as keras.layers.Embedding, but its gradient is dense: an embedding
    lookup's sparse gradient makes optimizers such as RMSprop trace data-dependent
    shapes (Where, ScatterNd) that a TPU step cannot compile.
    """

    def __init__(self, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            shape=(VOCAB, self.dim),
            initializer=keras.initializers.RandomUniform(-0.05, 0.05),
            name="embeddings",
        )

    def call(self, ids):
        one_hot = keras.ops.one_hot(ids, VOCAB, dtype=self.compute_dtype)
        return keras.ops.matmul(one_hot, self.embeddings)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.dim)


@register("shakespeare")
class Shakespeare(Model):
    """Byte embedding -> stacked LSTMs -> logits over the next byte, at every position."""

    # The held-out text (its last config.data.eval_fraction, or config.data.eval_path):
    # a validation split, which chooses the best checkpoint.
    eval_splits = ("val",)

    def _ids(self, mode: Mode) -> np.ndarray:
        data, seq_len = self.config.data, self.config.seq_len
        ids = read_ids(data.path)
        if data.eval_path:
            ids = ids if mode is Mode.TRAIN else read_ids(data.eval_path)
            where = data.path if mode is Mode.TRAIN else data.eval_path
        else:
            cut = int(len(ids) * (1 - data.eval_fraction))
            ids = ids[:cut] if mode is Mode.TRAIN else ids[cut:]
            where = f"{data.path} ({'first' if mode is Mode.TRAIN else 'held-out last'} part)"
        if len(ids) < seq_len + 1:
            raise RunError(
                f"{mode.value} text {where} has {len(ids)} bytes; a window needs "
                f"config.seq_len + 1 = {seq_len + 1}: use a longer text (or config.data."
                "eval_fraction / eval_path) or a smaller --config.seq_len"
            )
        return ids

    def _prompt(self) -> np.ndarray:
        prompt = encode(self.config.predict.prompt)
        if not len(prompt):
            raise UsageError("--prompt is empty; give the text to continue, e.g. --prompt='ROMEO:'")
        return prompt

    def train_arrays(self) -> TrainArrays:
        ids = self._ids(Mode.TRAIN)
        seq_len = self.config.seq_len

        def windows(arrays, starts):
            """The windows at offsets `starts`: inputs, and targets one byte later."""
            window = tf.gather(arrays["text"], starts[:, None] + tf.range(seq_len + 1))
            return {FEATURE: window[:, :-1]}, window[:, 1:]

        # Windows of seq_len + 1 bytes fit at len(ids) - seq_len offsets.
        return TrainArrays({"text": ids}, count=len(ids) - seq_len, batch=windows)

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        """EVAL and PREDICT; TRAIN comes from train_arrays."""
        seq_len = self.config.seq_len
        if mode is Mode.PREDICT:
            # The standard predict step (and `tpurun check`): the prompt, once per
            # sample, -> the next byte. `tpurun predict` itself runs `generate`.
            prompt = self._prompt()
            dataset = tf.data.Dataset.from_tensors({FEATURE: prompt})
            dataset = dataset.repeat(self.config.predict.num_samples)
            dataset = dataset.shard(params.num_input_pipelines, params.input_pipeline_id)
            return dataset.batch(params.batch_size)
        ids = self._ids(mode)
        count = (len(ids) - 1) // seq_len
        starts = np.arange(count) * seq_len
        windows = tf.data.Dataset.from_tensor_slices(ids[starts[:, None] + np.arange(seq_len + 1)])
        windows = windows.shard(params.num_input_pipelines, params.input_pipeline_id)
        windows = windows.batch(params.batch_size)
        dataset = windows.map(lambda w: ({FEATURE: w[:, :-1]}, w[:, 1:]))
        return dataset.prefetch(tf.data.AUTOTUNE)

    def build(self) -> keras.Model:
        config = self.config
        inputs = {FEATURE: keras.Input(shape=(None,), dtype="int32", name=FEATURE)}
        net = ByteEmbedding(config.embedding_dim, name="embedding")(inputs[FEATURE])
        for index, units in enumerate(config.lstm_units):
            net = keras.layers.LSTM(units, return_sequences=True, name=f"lstm_{index}")(net)
        logits = keras.layers.Dense(VOCAB, name="logits")(net)
        return keras.Model(inputs=inputs, outputs=logits, name="shakespeare")

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        per_byte = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)
        return tf.reduce_mean(per_byte, axis=-1)

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        # Over every position of the window (the sample weight masks whole windows).
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        last = outputs[:, -1, :]
        return {
            "next_char_ids": tf.argmax(last, axis=-1, output_type=tf.int32),
            "probabilities": tf.nn.softmax(last),
            "logits": last,
        }

    def serving_input_spec(self, predict_spec: Any) -> Any:
        return {FEATURE: tf.TensorSpec([None, None], tf.int32, name=FEATURE)}

    def generate(
        self, keras_model: keras.Model, strategy: tf.distribute.Strategy
    ) -> list[dict[str, Any]]:
        """Continues --prompt: `num_samples` texts of `length` sampled bytes each."""
        predict = self.config.predict
        prompt = self._prompt()
        if predict.length < 1 or predict.num_samples < 1:
            raise UsageError("config.predict.length and num_samples must be >= 1")
        if predict.temperature < 0:
            raise UsageError(f"config.predict.temperature={predict.temperature} must be >= 0")
        sampled = sample(
            keras_model,
            num_layers=len(self.config.lstm_units),
            prompt=prompt,
            samples=predict.num_samples,
            length=predict.length,
            temperature=predict.temperature,
            seed=self.config.seed,
        )
        return [{"text": decode(np.concatenate([prompt, row]))} for row in sampled]

    def format_predictions(self, rows: list[dict[str, Any]]) -> list[str]:
        if len(rows) == 1:
            return [str(rows[0]["text"])]
        lines = []
        for index, row in enumerate(rows):
            lines += [f"--- sample {index + 1} ---", str(row["text"])]
        return lines


def sample(
    keras_model: keras.Model,
    num_layers: int,
    prompt: np.ndarray,
    samples: int,
    length: int,
    temperature: float,
    seed: int,
) -> np.ndarray:
    """Runs the trained layers one byte at a time: int32 [samples, length] sampled ids.

    Uses the LSTM layers' cells with explicit states, so each new byte costs one
    step, not a pass over the whole text so far; the loops run in one tf.function.
    """
    embedding = keras_model.get_layer("embedding")
    cells = [keras_model.get_layer(f"lstm_{i}").cell for i in range(num_layers)]
    dense = keras_model.get_layer("logits")

    def step(ids, states):
        net = embedding(ids)
        new_states = []
        for cell, state in zip(cells, states, strict=True):
            net, state = cell(net, state, training=False)
            new_states.append(state)
        return dense(net), new_states

    def pick(logits, t):
        if temperature == 0:
            return tf.argmax(logits, axis=-1, output_type=tf.int32)
        drawn = tf.random.stateless_categorical(
            logits / temperature, 1, seed=tf.stack([seed, t]), dtype=tf.int32
        )
        return drawn[:, 0]

    @tf.function
    def run(prompt_ids):
        states = [
            [tf.zeros([samples, cell.units]), tf.zeros([samples, cell.units])] for cell in cells
        ]
        logits = tf.zeros([samples, VOCAB])

        def feed(t, logits, states):
            logits, states = step(tf.fill([samples], prompt_ids[t]), states)
            return t + 1, logits, states

        _, logits, states = tf.while_loop(
            lambda t, *_: t < tf.size(prompt_ids), feed, [tf.constant(0), logits, states]
        )

        def generate_one(t, logits, states, out):
            ids = pick(logits, t)
            logits, states = step(ids, states)
            return t + 1, logits, states, out.write(t, ids)

        out = tf.TensorArray(tf.int32, size=length)
        _, _, _, out = tf.while_loop(
            lambda t, *_: t < length, generate_one, [tf.constant(0), logits, states, out]
        )
        return tf.transpose(out.stack())

    return run(tf.constant(prompt)).numpy()
