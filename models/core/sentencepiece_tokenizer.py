"""SentencePiece pieces mapped through a vocabulary file: the ids of Hugging Face's Marian and M2M100 tokenizers.

Imports no torch and no transformers: the server tokenises imported models
through this module, with the same `sentencepiece` library those tokenizers
call, so ids agree by construction rather than by re-implementation
(tests/integration/test_huggingface.py checks them against transformers on awkward text).

What both tokenizers do, and this class repeats:
  * SentencePiece segments the text (its own normaliser applies), giving pieces;
  * each piece is looked up in `vocab.json` (the model's ids, not the .spm's),
    a piece the vocabulary lacks becomes <unk>;
  * </s> is appended.
Marian also splits a leading `>>xxx<<` target-language code off the text as
one piece (multi-target OPUS-MT models). M2M100/NLLB language tokens are
added by the caller (server/frontend/hosted.py), since which one depends on the request.

Decoding drops special tokens (</s>, <pad>, <unk>, language tokens), joins the
pieces and turns the "▁" word marker into spaces, as `decode(...,
skip_special_tokens=True)` does for ordinary pieces.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import sentencepiece as spm

from models.core.tokenizer import PieceTable

WORD_MARK = "\u2581"
LANGUAGE_CODE = re.compile(r"^>>.+?<<")  # Marian's multi-target prefix, e.g. ">>fra<<"


class SentencePieceTokenizer(PieceTable):
    """Source and target SentencePiece models plus the piece -> id vocabularies the model was trained with."""

    def __init__(self, source_model: Path, vocab: dict[str, int], *, eos_id: int, pad_id: int, unk_id: int,
                 target_model: Optional[Path] = None, target_vocab: Optional[dict[str, int]] = None,
                 skip_ids: Iterable[int] = (), split_language_code: bool = False):
        self.source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.target = spm.SentencePieceProcessor(model_file=str(target_model)) if target_model else self.source
        self.vocab = vocab
        target_vocab = target_vocab or vocab
        self.target_vocab = target_vocab
        self.eos_id, self.pad_id, self.unk_id = eos_id, pad_id, unk_id
        self.split_language_code = split_language_code
        size = max(target_vocab.values()) + 1
        self._pieces = [""] * size  # target id -> piece (decoding reads target ids only)
        for piece, idx in target_vocab.items():
            self._pieces[idx] = piece
        self.skip = frozenset({eos_id, pad_id, unk_id, *skip_ids})

    # -- bundle round trip --------------------------------------------------------------
    @classmethod
    def from_entry(cls, entry: dict[str, Any], folder: Path) -> "SentencePieceTokenizer":
        """Build from a bundle's `tokenizer` section (see `entry` below)."""
        def vocab(name: Optional[str]) -> Optional[dict[str, int]]:
            return json.loads((folder / name).read_text(encoding="utf-8")) if name else None
        return cls(folder / entry["source_model"], vocab(entry["vocab"]), eos_id=entry["eos_id"],
                   pad_id=entry["pad_id"], unk_id=entry["unk_id"],
                   target_model=folder / entry["target_model"] if entry.get("target_model") else None,
                   target_vocab=vocab(entry.get("target_vocab")), skip_ids=entry.get("skip_ids", ()),
                   split_language_code=entry.get("split_language_code", False))

    @staticmethod
    def entry(source_model: str, vocab: str, *, eos_id: int, pad_id: int, unk_id: int,
              target_model: Optional[str] = None, target_vocab: Optional[str] = None,
              skip_ids: Sequence[int] = (), split_language_code: bool = False) -> dict[str, Any]:
        """The `tokenizer` section of a bundle's config.json for this kind (file names relative to the bundle)."""
        return {"kind": "sentencepiece", "source_model": source_model, "target_model": target_model,
                "vocab": vocab, "target_vocab": target_vocab, "eos_id": eos_id, "pad_id": pad_id,
                "unk_id": unk_id, "skip_ids": sorted(set(skip_ids)), "split_language_code": split_language_code}

    # -- the tokenizer contract (as models/core/tokenizer.py's SubwordTokenizer) ---------------
    @property
    def vocab_size(self) -> int:
        return max(self.vocab.values()) + 1

    def token_id(self, piece: str) -> Optional[int]:
        return self.vocab.get(piece)

    def _pieces_of(self, text: str) -> list[str]:
        pieces: list[str] = []
        if self.split_language_code:
            code = LANGUAGE_CODE.match(text)
            if code:
                pieces.append(code.group(0))
                text = text[code.end():]
        return pieces + self.source.encode(text, out_type=str)

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        unk = self.unk_id
        ids = [self.vocab.get(p, unk) for p in self._pieces_of(text)]
        return ids + [self.eos_id] if add_eos else ids

    def encode_target(self, text: str) -> list[int]:
        """Target-side text (a translation's prefix) -> target ids, no EOS: the target model and vocabulary."""
        unk = self.unk_id
        return [self.target_vocab.get(p, unk) for p in self.target.encode(text, out_type=str)]

    def decode(self, ids: Iterable[int]) -> str:
        pieces = [self.piece(i) for i in ids if i not in self.skip]
        return "".join(pieces).replace(WORD_MARK, " ").strip()
