"""The BERT converter (models/bert_text.py): FullTokenizer's ids, run_classifier's records.

The reference is tests/bert_tokenizer_reference.py, tokenization.py's algorithm written
from its publication; the converter is HuggingFace's tokenizers assembled to match it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import bert_tokenizer_reference as reference
import forked
import pytest
from conftest import OFFLINE_ENV

VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "un",
    "##aff", "##able", "a", "##b", "##c", "é", "e", "ς", "σ", "οδος", "οδο", "##ς", "##σ",
    "中", "国", "i", "##ı", "hello", ",", ".", "!", "'", "s", "##s", "ा", "क", "##ा", "fi",
    "x", "##x", "ﬁ", "cafe", "café", "naïve", "naive", "d", "##on", "don", "t", "𫠠",
]  # fmt: skip

# Hostile text: accents and their case, CJK (an Extension E ideograph tokenizers' own
# BertNormalizer misses), controls and format characters, every kind of whitespace,
# punctuation of several scripts, a private-use character, combining marks alone, a
# final capital sigma, dotted capital I, a spacing mark (Devanagari's aa, Mc), a
# ligature, words of 200 and 201 characters, nothing at all.
HOSTILE = [
    "", "   ", "The quick, brown fox!", "unaffable", "Café CAFÉ cafe\u0301 naïve NAÏVE",
    "ΟΔΟΣ οδοσ ΟΔΟΣ. Σ ΑΣ'Β", "中国x 𫠠𫠠", "hello\x00wo\u200brld\ufffd", "a\u2028b\u2029c",
    "a\tb\nc\rd\x0bq\x0cz\x85y\xa0w\u3000v", "\ue000 x \ue000x", "don't", "\u0301x \u0301",
    "İ ı I", "क ा का", "ﬁ fi", "x" * 200, "x" * 201, "¿¡«»—…", "a\x7fb",
]  # fmt: skip


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def tokenizers(request, vocab_file):
    from tpurun.models import bert_text

    lower = request.param
    ours = bert_text.wordpiece_tokenizer(bert_text.load_vocab(vocab_file), lower)
    return ours, reference.FullTokenizer(vocab_file, lower)


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_gets_full_tokenizers_ids(tokenizers, text):
    ours, full = tokenizers
    assert ours.encode(text, add_special_tokens=False).ids == full.ids(text)


def random_texts(count: int, seed: int) -> list[str]:
    """Strings of 1-12 characters drawn from ASCII, the BMP and all of Unicode, keeping the
    characters Python 3.11's tables assign (the module docstring of bert_text: newer ones
    are classified by tokenizers' newer tables)."""
    rng = random.Random(seed)
    texts = []
    while len(texts) < count:
        chars = []
        for _ in range(rng.randrange(1, 13)):
            cp = rng.choice(
                [rng.randrange(0x20, 0x7F), rng.randrange(0, 0x3000), rng.randrange(0, 0x30000)]
            )
            char = chr(cp)
            if unicodedata.category(char) not in ("Cn", "Cs"):
                chars.append(char)
        texts.append("".join(chars))
    return texts


def test_random_unicode_gets_full_tokenizers_ids(tokenizers):
    ours, full = tokenizers
    texts = random_texts(3000, seed=5)
    got = [encoding.ids for encoding in ours.encode_batch(texts, add_special_tokens=False)]
    differ = [(text, g) for text, g in zip(texts, got, strict=True) if g != full.ids(text)]
    assert not differ, differ[:3]


def single_example(full, text_a, text_b, label_id, max_seq_length) -> dict[str, list[int]]:
    """run_classifier.py's convert_single_example, with the reference tokenizer."""
    tokens_a = full.tokenize(text_a)
    tokens_b = full.tokenize(text_b) if text_b else None
    if tokens_b:
        while len(tokens_a) + len(tokens_b) > max_seq_length - 3:
            (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
    else:
        tokens_a = tokens_a[: max_seq_length - 2]
    tokens = ["[CLS]", *tokens_a, "[SEP]"]
    segments = [0] * len(tokens)
    if tokens_b:
        tokens += [*tokens_b, "[SEP]"]
        segments += [1] * (len(tokens_b) + 1)
    ids = [full.vocab[t] for t in tokens]
    pad = [0] * (max_seq_length - len(ids))
    return {
        "input_ids": ids + pad,
        "input_mask": [1] * len(ids) + pad,
        "segment_ids": segments + pad,
        "label_ids": [label_id],
        "is_real_example": [1],
    }


def read_records(path: Path) -> list[dict[str, list[int]]]:
    import tensorflow as tf

    rows = []
    for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
        feature = tf.train.Example.FromString(record).features.feature
        rows.append({key: list(feature[key].int64_list.value) for key in feature})
    return rows


ROWS = [
    ("The quick brown fox", "unaffable", "pos"),
    ('hello, "hello"! don\'t', "", "neg"),  # no text_b; bare quotes in a TSV
    ("中国 the", " ".join(["the"] * 20), "pos"),  # the pair truncated, text_b popped
    ("the " * 20, "fox fox", "neither"),  # text_a popped
    ("\x00\u200b", "Café", "neg"),  # text_a tokenizes to nothing
    ("fox", "\u0301", "pos"),  # text_b tokenizes to nothing: a single text
]


def test_a_tsv_becomes_run_classifiers_records(tmp_path, vocab_file):
    from tpurun.models import bert_text

    source = tmp_path / "train.tsv"
    lines = ["label\ttext_a\ttext_b", *("\t".join((c, a, b)) for a, b, c in ROWS)]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = bert_text.convert(
        str(source), str(tmp_path / "train.tfrecord"), vocab_file, max_seq_length=12,
        labels="neg,pos,neither",
    )  # fmt: skip
    assert done == {"examples": 6, "truncated": 2, "labels": ["neg", "pos", "neither"]}
    full = reference.FullTokenizer(vocab_file)
    ids = {"neg": 0, "pos": 1, "neither": 2}
    want = [single_example(full, a, b, ids[c], 12) for a, b, c in ROWS]
    assert read_records(tmp_path / "train.tfrecord") == want


def test_the_command_converts_a_csv_and_says_what_to_train_with(tmp_path, vocab_file):
    """`python -m tpurun.models.bert_text` (a process: its flags are its own), labels
    sorted as numbers, a quoted CSV field with a comma and a newline in it."""
    source = tmp_path / "dev.csv"
    source.write_text('sentence,label\n"fox, the\nfox",10\nthe,2\n', encoding="utf-8")
    result = forked.run(
        [sys.executable, "-m", "tpurun.models.bert_text", f"--vocab_file={vocab_file}",
         f"--input={source}", f"--output={tmp_path / 'dev.tfrecord'}", "--text_a=sentence",
         "--text_b=", "--max_seq_length=8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **OFFLINE_ENV}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "2 examples (0 truncated" in result.stdout and "labels 0=2 1=10" in result.stdout
    assert "--config.data.train_examples=2 --config.num_labels=2" in result.stdout
    rows = read_records(tmp_path / "dev.tfrecord")
    assert [r["label_ids"] for r in rows] == [[1], [0]]
    assert rows[0]["input_ids"] == [2, 8, 28, 5, 8, 3, 0, 0]


@pytest.mark.parametrize(
    ("header", "flags", "message"),
    [
        ("text,label", {}, "has no column --text_a=text_a"),
        ("text_a,label", {"labels": "a"}, "label 'b' is not one of --labels=a"),
        ("text_a,label\n", {}, "has a header and no rows"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, vocab_file, header, flags, message):
    from tpurun.models import bert_text

    from tpurun.errors import UsageError

    source = tmp_path / "bad.csv"
    source.write_text(header if header.endswith("\n") else f"{header}\nthe,b\n", encoding="utf-8")
    with pytest.raises(UsageError, match=message):
        bert_text.convert(str(source), str(tmp_path / "out"), vocab_file, **flags)
    assert not (tmp_path / "out").exists()


def test_a_vocab_without_its_special_tokens_is_refused(tmp_path):
    from tpurun.models import bert_text

    from tpurun.errors import RunError

    path = tmp_path / "vocab.txt"
    path.write_text("the\n[UNK]\n", encoding="utf-8")
    with pytest.raises(RunError, match=r"has no \[CLS\], \[SEP\]"):
        bert_text.load_vocab(str(path))
