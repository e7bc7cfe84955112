r"""Text to run_classifier.py's records: TSV or CSV (text_a, optional text_b, label) -> TFRecords.

    python -m tpurun.models.bert_text --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \
        --input=train.tsv --output=gs://BUCKET/glue/train.tfrecord --labels=0,1

Each row becomes what run_classifier.py's convert_single_example makes of it: text_a
and text_b tokenized as tokenization.py's FullTokenizer tokenizes them with the same
vocab.txt (and --do_lower_case); the pair truncated to max_seq_length - 3 by popping
the last token of the longer (of text_b on a tie), a single text to max_seq_length - 2;
`[CLS] a [SEP] b [SEP]` with segment 0 for `[CLS] a [SEP]` and 1 for `b [SEP]`; input_ids,
input_mask and segment_ids zero-padded to max_seq_length; label_ids the label's index in
--labels; is_real_example 1. The records are `bert_records`' classifier records.

The tokenizer is HuggingFace's `tokenizers` (Rust; no TensorFlow dependency, so it
installs beside tensorflow-tpu on a TPU VM, which tensorflow-text does not: it requires
the `tensorflow` wheel by name), assembled to give FullTokenizer's ids
(tests/test_bert_text.py compares them on hostile text): tokenizers' BertNormalizer and
BertPreTokenizer differ from tokenization.py where it matters (private-use and
unassigned characters dropped, Mc and Me marks stripped with the accents, a final
capital sigma, CJK Extension E's first 256 characters, punctuation by older Unicode
tables), so the steps are written out with tokenization.py's own character classes.
Characters are classified by tokenizers' Unicode tables, which are newer than Python
3.11's (Unicode 14): a character assigned since may be split or stripped where
tokenization.py under that Python would not. Rows are tokenized in parallel batches.

Install its library with `pip install 'tpurun[text]'`.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tpurun.errors import RunError, UsageError

UNK, CLS, SEP = "[UNK]", "[CLS]", "[SEP]"
# tokenization.py's WordpieceTokenizer: a longer word is [UNK] whole.
MAX_CHARS_PER_WORD = 200
# tokenization.py's classes, as regexes of tokenizers' (Oniguruma) syntax.
_REMOVED = r"[\x{0}\x{fffd}]|[\p{Cc}\p{Cf}&&[^\t\n\r]]"  # NUL, U+FFFD, controls
_WHITESPACE = r"[\t\n\r\p{Zs}]"
_CJK = (
    r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}"
    r"\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]"
)
_PUNCTUATION = r"[\p{P}\x{21}-\x{2f}\x{3a}-\x{40}\x{5b}-\x{60}\x{7b}-\x{7e}]"
# Python's str.lower() makes a capital sigma final (ς) after a cased letter (case-
# ignorable characters between) and before none; tokenizers' Lowercase maps each
# character alone. Up to two case-ignorable characters between are looked back over.
_FINAL_SIGMA = (
    r"(?<=\p{Cased}|\p{Cased}\p{Case_Ignorable}|\p{Cased}\p{Case_Ignorable}{2})"
    r"Σ(?!\p{Case_Ignorable}*\p{Cased})"
)


def load_vocab(path: str) -> dict[str, int]:
    """tokenization.py's load_vocab: one token a line, stripped, numbered from 0."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path) as f:
            vocab = {line.strip(): index for index, line in enumerate(f)}
    except (tf.errors.OpError, UnicodeDecodeError) as e:
        raise RunError(f"--vocab_file={path}: cannot read it ({e})") from None
    missing = [token for token in (UNK, CLS, SEP) if token not in vocab]
    if missing:
        raise RunError(
            f"--vocab_file={path} has no {', '.join(missing)}: use the vocab.txt published "
            "with the checkpoint"
        )
    return vocab


def wordpiece_tokenizer(vocab: dict[str, int], lower_case: bool) -> Any:
    """A `tokenizers.Tokenizer` that gives FullTokenizer's ids (the module docstring)."""
    try:
        from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import WordPiece
    except ImportError:
        raise RunError(
            "the converter needs HuggingFace's tokenizers: pip install 'tpurun[text]'"
        ) from None
    steps = [
        normalizers.Replace(Regex(_REMOVED), ""),
        normalizers.Replace(Regex(_WHITESPACE), " "),
    ]
    if lower_case:  # lower-case, then NFD and drop the nonspacing marks (Mn) alone
        steps += [
            normalizers.Replace(Regex(_FINAL_SIGMA), "ς"),
            normalizers.Lowercase(),
            normalizers.NFD(),
            normalizers.Replace(Regex(r"\p{Mn}"), ""),
        ]
    tokenizer = Tokenizer(
        WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=MAX_CHARS_PER_WORD)
    )
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(_CJK), behavior="isolated"),
            pre_tokenizers.Split(Regex(_PUNCTUATION), behavior="isolated"),
        ]
    )
    return tokenizer


def read_rows(path: str, text_a: str, text_b: str | None, label: str) -> Any:
    """The columns of a TSV (by its extension .tsv, else CSV) with a header row, as strings:
    a pandas DataFrame of text_a, text_b ("" without one) and label ("" without one).
    `text_b` None: the column text_b if there is one."""
    import pandas as pd

    tsv = path.endswith((".tsv", ".tsv.gz"))
    try:
        table = pd.read_csv(
            path,
            sep="\t" if tsv else ",",
            # run_classifier's _read_tsv: no quoting in a TSV (GLUE's hold bare quotes)
            quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
            dtype=str,
            keep_default_na=False,
            encoding="utf-8",
        )
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise RunError(
            f"--input={path}: cannot read it as {'TSV' if tsv else 'CSV'} ({e})"
        ) from None
    if not text_a:
        raise UsageError("--text_a is empty: name the column of the first text")
    if text_b is None:
        text_b = "text_b" if "text_b" in table else ""
    wanted = {"--text_a": text_a, "--text_b": text_b, "--label": label}
    absent = [f"{flag}={name}" for flag, name in wanted.items() if name and name not in table]
    if absent:
        raise UsageError(
            f"--input={path} has no column {', '.join(absent)} (its header: "
            f"{', '.join(map(str, table.columns))}); name the columns with --text_a, "
            '--text_b ("" for single texts) and --label ("" for unlabelled rows)'
        )
    return pd.DataFrame(
        {
            key: table[name] if name else ""
            for key, name in zip(("text_a", "text_b", "label"), wanted.values(), strict=True)
        }
    )


def label_list(labels: Sequence[str], given: str) -> list[str]:
    """--labels (comma-separated, in id order), else the distinct labels sorted (as numbers
    when they all are)."""
    if given:
        return [label.strip() for label in given.split(",")]
    distinct = sorted(set(labels) - {""})
    if distinct and all(label.lstrip("-").isdigit() for label in distinct):
        distinct.sort(key=int)
    return distinct


def truncate_pair(a: list[int], b: list[int], max_length: int) -> None:
    """run_classifier.py's _truncate_seq_pair: pop from the longer until both fit."""
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()


def encode_rows(
    tokenizer: Any, vocab: dict[str, int], rows: Any, max_seq_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """input_ids, input_mask, segment_ids [rows, max_seq_length] (int64) of run_classifier's
    convert_single_example, and how many rows were truncated."""
    texts_a = tokenizer.encode_batch(list(rows["text_a"]), add_special_tokens=False)
    has_b = rows["text_b"].astype(bool).to_numpy()
    texts_b = tokenizer.encode_batch(list(rows["text_b"][has_b]), add_special_tokens=False)
    ids = np.zeros((len(rows), max_seq_length), np.int64)
    segments = np.zeros_like(ids)
    lengths = np.zeros(len(rows), np.int64)
    cls, sep, truncated = vocab[CLS], vocab[SEP], 0
    b_iter = iter(texts_b)
    for row, (encoded_a, pair) in enumerate(zip(texts_a, has_b, strict=True)):
        a = encoded_a.ids
        b = next(b_iter).ids if pair else []
        # A text_b that tokenizes to nothing is none (run_classifier's `if tokens_b`).
        budget = max_seq_length - (3 if b else 2)
        if len(a) + len(b) > budget:
            truncated += 1
            if b:
                truncate_pair(a, b, budget)
            else:
                del a[budget:]
        sequence = [cls, *a, sep] + ([*b, sep] if b else [])
        ids[row, : len(sequence)] = sequence
        segments[row, len(a) + 2 : len(sequence)] = 1
        lengths[row] = len(sequence)
    mask = (np.arange(max_seq_length) < lengths[:, None]).astype(np.int64)
    return ids, mask, segments, truncated


def write_records(
    path: str, ids: np.ndarray, mask: np.ndarray, segments: np.ndarray, label_ids: np.ndarray
) -> None:
    """run_classifier.py's records (is_real_example 1), to a local or gs:// path."""
    import tensorflow as tf

    features = {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": segments,
        "label_ids": label_ids[:, None],
        "is_real_example": np.ones((len(ids), 1), np.int64),
    }
    try:
        with tf.io.TFRecordWriter(path) as writer:
            for start in range(0, len(ids), RECORDS_PER_CHUNK):
                chunk = {k: v[start : start + RECORDS_PER_CHUNK] for k, v in features.items()}
                for record in serialized_examples(chunk).numpy():
                    writer.write(record)
    except tf.errors.OpError as e:
        raise RunError(f"--output={path}: cannot write it ({e.message})") from None


# Rows serialized per batch of tf.io.encode_proto calls.
RECORDS_PER_CHUNK = 10_000


def serialized_examples(features: dict[str, np.ndarray]) -> Any:
    """tf.train.Examples of int64 features ([rows, length] each), serialized by
    tf.io.encode_proto, a batch at a time: 3x faster than building each Example in Python.
    Example { features { feature { key, value: Feature { int64_list { value } } } } }."""
    import tensorflow as tf

    rows = len(next(iter(features.values())))

    def encode(message: str, fields: dict[str, Any], sizes: list[int]) -> Any:
        counts = tf.constant([sizes] * rows, tf.int32)
        return tf.io.encode_proto(counts, list(fields.values()), list(fields), message)

    entries = []
    for key, values in features.items():
        values = tf.constant(values, tf.int64)
        int64_list = encode("tensorflow.Int64List", {"value": values}, [values.shape[1]])
        feature = encode("tensorflow.Feature", {"int64_list": int64_list[:, None]}, [1])
        keys = tf.fill([rows, 1], key)
        entry = {"key": keys, "value": feature[:, None]}
        entries.append(encode("tensorflow.Features.FeatureEntry", entry, [1, 1]))
    stacked = tf.stack(entries, axis=1)
    example_features = encode("tensorflow.Features", {"feature": stacked}, [len(entries)])
    return encode("tensorflow.Example", {"features": example_features[:, None]}, [1])


def convert(
    input_path: str,
    output_path: str,
    vocab_file: str,
    *,
    do_lower_case: bool = True,
    max_seq_length: int = 128,
    labels: str = "",
    columns: tuple[str, str | None, str] = ("text_a", None, "label"),
) -> dict[str, Any]:
    """Converts one TSV/CSV file; returns what a user needs next: examples, truncated, labels."""
    if max_seq_length < 3:
        raise UsageError(
            f"--max_seq_length={max_seq_length} leaves no room for [CLS] a [SEP] b [SEP]"
        )
    vocab = load_vocab(vocab_file)
    rows = read_rows(input_path, *columns)
    if not len(rows):
        raise UsageError(f"--input={input_path} has a header and no rows: nothing to convert")
    names = label_list(list(rows["label"]), labels)
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(rows["label"]) - set(index) - ({""} if not columns[2] else set()))
    if unknown:
        raise UsageError(
            f"--input={input_path}: label {unknown[0]!r} is not one of --labels={','.join(names)}; "
            "list every label, in the order of their ids"
        )
    label_ids = np.array([index.get(label, 0) for label in rows["label"]], np.int64)
    tokenizer = wordpiece_tokenizer(vocab, do_lower_case)
    ids, mask, segments, truncated = encode_rows(tokenizer, vocab, rows, max_seq_length)
    write_records(output_path, ids, mask, segments, label_ids)
    return {"examples": len(rows), "truncated": truncated, "labels": names}


def main(argv: Sequence[str]) -> int:
    """The command: `python -m tpurun.models.bert_text --flag=value ...`; its exit code."""
    from absl import flags

    values = _flag_values()
    try:
        extra = values(list(argv))[1:]
        if extra:
            raise flags.Error(f"unexpected arguments {extra}; flags are written --name=value")
    except flags.Error as e:
        print(f"bert_text: error: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        done = convert(
            values.input,
            values.output,
            values.vocab_file,
            do_lower_case=values.do_lower_case,
            max_seq_length=values.max_seq_length,
            labels=values.labels,
            columns=(values.text_a, values.text_b, values.label),
        )
    except (RunError, UsageError) as e:
        print(f"bert_text: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    names = " ".join(f"{i}={name}" for i, name in enumerate(done["labels"]))
    print(
        f"{values.output}: {done['examples']} examples ({done['truncated']} truncated to "
        f"--max_seq_length={values.max_seq_length}); labels {names or '(none)'}"
    )
    print(
        f"train with --config.data.train_examples={done['examples']} "
        f"--config.num_labels={len(done['labels'])} --config.max_seq_length={values.max_seq_length}"
    )
    return 0


def _flag_values() -> Any:
    """The converter's flags, named as run_classifier.py's where it has them, in a FlagValues
    of their own (tpurun's --input is another flag)."""
    from absl import flags

    values = flags.FlagValues()

    def define(kind: Any, name: str, default: Any, text: str, **more: Any) -> None:
        kind(name, default, text, flag_values=values, **more)

    define(flags.DEFINE_string, "input", None, "A TSV (.tsv) or CSV file with a header row.",
           required=True)  # fmt: skip
    define(flags.DEFINE_string, "output", None, "The TFRecord file to write (local or gs://).",
           required=True)  # fmt: skip
    define(flags.DEFINE_string, "vocab_file", None, "The checkpoint's vocab.txt.", required=True)
    define(flags.DEFINE_bool, "do_lower_case", True, "Lower-case and strip accents (uncased).")
    define(flags.DEFINE_integer, "max_seq_length", 128, "Tokens per example, [CLS] and [SEP] in.")
    define(flags.DEFINE_string, "labels", "", "The labels in id order, comma-separated; "
           "default: the input's, sorted (as numbers if they all are).")  # fmt: skip
    define(flags.DEFINE_string, "text_a", "text_a", "The column of the first text.")
    define(flags.DEFINE_string, "text_b", None, "The column of the second text (default: "
           'text_b if the input has one; "": single texts).')  # fmt: skip
    define(flags.DEFINE_string, "label", "label", 'The column of the label ("": unlabelled: id 0).')
    return values


if __name__ == "__main__":
    sys.exit(main(sys.argv))
