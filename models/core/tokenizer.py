"""Joint source/target subword tokenizer (HF `tokenizers` BPE, one JSON file).

Imports no torch: the server loads the same file through this module.

The tokenizer file carries its own normaliser (NFC, every Unicode whitespace
run -> one space, trimmed), so training, evaluation and serving all see the
same text without repeating the rules. Pieces use the SentencePiece "▁" word
marker, which makes detokenisation a pure function of the pieces: that is what
lets the server stream text deltas incrementally.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from models.core.config import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID

WORD_MARK = "\u2581"

_WS = re.compile(r"\s+")
_INVISIBLE = re.compile("[\u200b\u00ad]")


def normalize(text: str) -> str:
    """NFC; drop zero-width space and soft hyphen; every whitespace run (tab,
    NBSP, narrow NBSP, thin space...) becomes one space; trim."""
    text = unicodedata.normalize("NFC", text)
    return _WS.sub(" ", _INVISIBLE.sub("", text)).strip()


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([
        normalizers.NFC(),
        # Zero-width space and soft hyphen are invisible; drop them before BPE sees them.
        normalizers.Replace(Regex("[\u200b\u00ad]"), ""),
        normalizers.Replace(Regex(r"\s+"), " "),
        normalizers.Strip(),
    ])


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> "SubwordTokenizer":
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_MARK, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=WORD_MARK, prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return SubwordTokenizer(tok)


class PieceTable:
    """The contract's batch and piece helpers, for tokenizers holding a `_pieces` id -> piece list
    (models/core/sentencepiece_tokenizer.py, models/core/tokenizer_json.py)."""
    _pieces: list[str]

    def encode_batch(self, texts: Sequence[str], add_eos: bool = True) -> list[list[int]]:
        return [self.encode(t, add_eos) for t in texts]

    def piece(self, token_id: int) -> str:
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else ""

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def iter_pieces(self, ids: Iterable[int]) -> Iterator[str]:
        return (self.piece(i) for i in ids)


class SubwordTokenizer:
    """Thin wrapper fixing the special ids and the encode/decode contract."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        for idx, token in enumerate(SPECIAL_TOKENS):
            if tok.token_to_id(token) != idx:
                raise ValueError(f"tokenizer must map {token!r} to id {idx}, got {tok.token_to_id(token)}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
        self._pieces = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]

    @classmethod
    def load(cls, path: str | Path) -> "SubwordTokenizer":
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        self.tok.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def normalize(self, text: str) -> str:
        return self.tok.normalizer.normalize_str(text)

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return ids + [self.eos_id] if add_eos else ids

    def encode_target(self, text: str) -> list[int]:
        """Target-side text (a translation's prefix) -> ids, no EOS (a joint vocabulary)."""
        return self.encode(text, add_eos=False)

    def encode_batch(self, texts: Sequence[str], add_eos: bool = True) -> list[list[int]]:
        out = [enc.ids for enc in self.tok.encode_batch(list(texts), add_special_tokens=False)]
        return [ids + [self.eos_id] for ids in out] if add_eos else out

    def encode_batch_sampled(self, texts: Sequence[str], dropout: float, add_eos: bool = True) -> list[list[int]]:
        """BPE-dropout (Provilkov et al., 2020), for training only: each merge is skipped with
        probability `dropout`, so words also appear split into smaller pieces, the pieces a
        model otherwise meets only in rare words (where small models start looping)."""
        model = self.tok.model
        model.dropout = dropout
        try:
            return self.encode_batch(texts, add_eos)
        finally:
            model.dropout = None

    def piece(self, token_id: int) -> str:
        return self._pieces[token_id]

    def token_id(self, piece: str):
        return self.tok.token_to_id(piece)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; special tokens are dropped, "▁" becomes a space between words."""
        pieces = [self._pieces[i] for i in ids if i >= len(SPECIAL_TOKENS) or i == self.unk_id]
        return self.pieces_to_text(pieces)

    @staticmethod
    def pieces_to_text(pieces: Iterable[str]) -> str:
        return "".join(pieces).replace(WORD_MARK, " ").strip()

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def iter_pieces(self, ids: Iterable[int]) -> Iterator[str]:
        return (self._pieces[i] for i in ids)
