"""google-research/bert's FullTokenizer (tokenization.py), written here from its published algorithm.

The converter (`tpurun.models.bert_text`) must give these ids. Pure Python, as
tokenization.py is: the tests' reference and the benchmark's baseline.

* load_vocab: one token a line, stripped, numbered from 0;
* BasicTokenizer: drop NUL, U+FFFD and control characters (Cc, Cf; not tab, newline,
  carriage return), whitespace (those three, space, Zs) to a space; a space around every
  CJK ideograph; split on whitespace; per token, if uncased, lower-case and strip
  accents (NFD, drop Mn); split off every punctuation character (ASCII 33-47, 58-64,
  91-96, 123-126, or any P* category);
* WordpieceTokenizer: a word of more than 200 characters is [UNK]; else the longest
  prefix in the vocabulary, then the longest `##`-prefixed piece of the rest, ...; a
  word with a part no piece covers is [UNK] whole.
"""

from __future__ import annotations

import unicodedata

CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def load_vocab(path: str) -> dict[str, int]:
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            vocab[line.strip()] = index
    return vocab


def _is_whitespace(char: str) -> bool:
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(char: str) -> bool:
    cp = ord(char)
    return any(low <= cp <= high for low, high in CJK_RANGES)


def _split_on_punctuation(token: str) -> list[str]:
    pieces: list[list[str]] = []
    start_new = True
    for char in token:
        if _is_punctuation(char):
            pieces.append([char])
            start_new = True
        else:
            if start_new:
                pieces.append([])
            start_new = False
            pieces[-1].append(char)
    return ["".join(piece) for piece in pieces]


def basic_tokenize(text: str, lower_case: bool) -> list[str]:
    cleaned = []
    for char in text:
        if ord(char) in (0, 0xFFFD) or _is_control(char):
            continue
        cleaned.append(" " if _is_whitespace(char) else char)
    spaced = "".join(f" {c} " if _is_cjk(c) else c for c in cleaned)
    tokens = []
    for token in spaced.strip().split():
        if lower_case:
            token = token.lower()
            token = "".join(
                c for c in unicodedata.normalize("NFD", token) if unicodedata.category(c) != "Mn"
            )
        tokens.extend(_split_on_punctuation(token))
    return " ".join(tokens).strip().split()


def wordpiece(
    word: str, vocab: dict[str, int], unk: str = "[UNK]", max_chars: int = 200
) -> list[str]:
    if len(word) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end, piece = len(word), None
        while start < end:
            candidate = ("##" if start > 0 else "") + word[start:end]
            if candidate in vocab:
                piece = candidate
                break
            end -= 1
        if piece is None:
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


class FullTokenizer:
    def __init__(self, vocab_path: str, lower_case: bool = True):
        self.vocab = load_vocab(vocab_path)
        self.lower_case = lower_case

    def tokenize(self, text: str) -> list[str]:
        return [
            piece
            for token in basic_tokenize(text, self.lower_case)
            for piece in wordpiece(token, self.vocab)
        ]

    def ids(self, text: str) -> list[int]:
        return [self.vocab[token] for token in self.tokenize(text)]
