"""An imported model's own `tokenizer.json` (Hugging Face `tokenizers`), with its own special ids: NLLB-200.

Imports no torch and no transformers. transformers' NllbTokenizer is this same
file run by the same Rust library; what it adds around it, and this class
repeats, is the id layout: the source is `[source language] pieces </s>` (the
language token is added by the caller, server/frontend/hosted.py, from the request),
and decoding skips special tokens (</s>, <pad>, <unk>, the language codes).
Unlike models/core/tokenizer.py's SubwordTokenizer it does not require this repo's
fixed special ids (NLLB has <s> 0, <pad> 1, </s> 2, <unk> 3).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from tokenizers import Tokenizer

from models.core.tokenizer import PieceTable


class JsonTokenizer(PieceTable):
    def __init__(self, path: Path, *, eos_id: int, pad_id: int, unk_id: int, skip_ids: Iterable[int] = ()):
        self.tok = Tokenizer.from_file(str(path))
        self.eos_id, self.pad_id, self.unk_id = eos_id, pad_id, unk_id
        self.skip = frozenset({eos_id, pad_id, *skip_ids})
        self._pieces = [self.tok.id_to_token(i) or "" for i in range(self.tok.get_vocab_size())]

    @classmethod
    def from_entry(cls, entry: dict[str, Any], folder: Path) -> "JsonTokenizer":
        return cls(folder / entry["file"], eos_id=entry["eos_id"], pad_id=entry["pad_id"], unk_id=entry["unk_id"],
                   skip_ids=entry.get("skip_ids", ()))

    @staticmethod
    def entry(file: str, *, eos_id: int, pad_id: int, unk_id: int, skip_ids: Sequence[int] = ()) -> dict[str, Any]:
        """The `tokenizer` section of a bundle's config.json for this kind."""
        return {"kind": "tokenizer.json", "file": file, "eos_id": eos_id, "pad_id": pad_id, "unk_id": unk_id,
                "skip_ids": sorted(set(skip_ids))}

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def token_id(self, piece: str) -> Optional[int]:
        return self.tok.token_to_id(piece)

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return ids + [self.eos_id] if add_eos else ids

    def encode_target(self, text: str) -> list[int]:
        """Target-side text (a translation's prefix) -> ids, no EOS (one vocabulary for both sides)."""
        return self.encode(text, add_eos=False)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([i for i in ids if i not in self.skip], skip_special_tokens=True)
