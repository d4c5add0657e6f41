"""The tokenizer a bundle's config.json names, of whichever kind: the one place that knows every kind.

Each kind is its own module (models/core/tokenizer.py, sentencepiece_tokenizer.py, tokenizer_json.py);
they share the contract's helpers (tokenizer.PieceTable) and import nothing of each other, so this
chooser sits above them all.
"""
from __future__ import annotations

from pathlib import Path

from models.core.sentencepiece_tokenizer import SentencePieceTokenizer
from models.core.tokenizer import SubwordTokenizer
from models.core.tokenizer_json import JsonTokenizer


def load_tokenizer(entry: str | dict, folder: str | Path):
    """The tokenizer a bundle's config.json names: a tokenizer.json file (this repo's models), or a
    section for an imported Hugging Face model: `{"kind": "sentencepiece", ...}` (Marian, M2M100) or
    `{"kind": "tokenizer.json", ...}` (NLLB: its own tokenizer.json and special ids)."""
    folder = Path(folder)
    if isinstance(entry, str):
        return SubwordTokenizer.load(folder / entry)
    if entry.get("kind") == "sentencepiece":
        return SentencePieceTokenizer.from_entry(entry, folder)
    if entry.get("kind") == "tokenizer.json":
        return JsonTokenizer.from_entry(entry, folder)
    raise ValueError(f"unknown tokenizer kind {entry.get('kind')!r}")
