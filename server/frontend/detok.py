"""Incremental detokenisation for streaming.

The full text of the tokens so far is recomputed with the same function the
unary path uses, and only a text that extends what was already sent is
emitted. Trailing whitespace is held back until something follows it (the
final text is trimmed), so the concatenated deltas always equal the unary
result, and a delta never ends inside a character or a word piece.
"""
from __future__ import annotations

from models.core.tokenizer import SubwordTokenizer


class IncrementalDetokenizer:
    def __init__(self, tok: SubwordTokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the new text that is safe to emit (possibly empty)."""
        self.ids.extend(token_ids)
        text = self.tok.decode(self.ids).rstrip()
        if not text.startswith(self.sent):
            return ""  # cannot happen with word-marker pieces; hold rather than emit wrong text
        delta, self.sent = text[len(self.sent):], text
        return delta

    def finish(self) -> str:
        """The remainder at the end of the sequence."""
        text = self.tok.decode(self.ids)
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return delta
