"""Blank text: what shows nothing, the same rule for the server's documents and the file client.

A cell or a line made of spaces of any kind (NBSP, figure space, narrow NBSP, ideographic
space...) and invisible characters (zero-width space and joiners, word joiner, BOM, bidi
marks, soft hyphen, the Hangul fillers that Unicode files as letters but render blank) has
nothing to translate: it is layout, passed through byte for byte, never an empty sentence.
"""
from __future__ import annotations

import re

# Format controls (Cf) that show nothing, and the blank-rendering fillers.
INVISIBLE = ("\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e"
             "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0")
BLANK_CHARS = rf"[\s{INVISIBLE}]"
_BLANK = re.compile(rf"{BLANK_CHARS}*")
_INVISIBLE = re.compile(rf"[{INVISIBLE}]")


def blank(text: str) -> bool:
    """Nothing but whitespace and invisible characters (True for "" too)."""
    return _BLANK.fullmatch(text) is not None


def visible(text: str) -> str:
    """`text` without its invisible characters (spaces kept)."""
    return _INVISIBLE.sub("", text)
