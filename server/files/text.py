"""Plain text and HTML files: the server's own document planners keep their layout byte for byte.

A text file is cut into pieces of whole lines (at most `PIECE_CHARS` characters and `PIECE_LINES`
lines each: within what one Translate call may carry) and translated as plain text: the server
keeps every newline, indentation and the spacing between sentences (server/texts/segment.py).
An HTML file is cut into pieces just before block elements (never inside a script, style, pre or
translate="no" element) and translated as text/html: tags, attributes, comments and entities come
back byte for byte, inline elements travel with their sentence (server/texts/html.py). The
file's encoding (UTF-8, with its byte order mark if it had one, or UTF-16) is kept.
"""
from __future__ import annotations

from server.texts.html import BLOCK_TAGS, MARKUP, NEVER_TRANSLATED, NO_TRANSLATE, tag_of
from server.files import Document
from server.files.checks import Limits, decode_text

PIECE_CHARS = 4_000  # characters of one piece of a text file (the server's text limit is 50,000)
PIECE_LINES = 64  # lines of one piece: each line is at least one sentence (512 sentences a call)
HTML_PIECE_CHARS = 4_000  # cut before block elements: a piece holds well under 512 sentences


def read_text(data: bytes, limits: Limits) -> Document:
    return _read_decoded(data, "txt", cut_lines, markup=False)


def _read_decoded(data: bytes, kind: str, cut, markup: bool) -> Document:
    """A text file in pieces (`cut`), written back in the encoding it came in."""
    text, encoding = decode_text(data, kind)

    def rebuild(translations: list[str], target: str) -> bytes:
        return "".join(translations).encode(encoding)
    return Document(cut(text), rebuild, markup=markup)


def cut_lines(text: str) -> list[str]:
    """Whole lines, grouped; a line longer than a piece is cut at its last whitespace that fits."""
    pieces, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        while len(line) > PIECE_CHARS:
            cut = line.rfind(" ", 0, PIECE_CHARS)
            cut = cut + 1 if cut > 0 else PIECE_CHARS
            if current:
                pieces.append("".join(current))
                current, size = [], 0
            pieces.append(line[:cut])
            line = line[cut:]
        if current and (size + len(line) > PIECE_CHARS or len(current) >= PIECE_LINES):
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        pieces.append("".join(current))
    return pieces


def read_html(data: bytes, limits: Limits) -> Document:
    return _read_decoded(data, "html", cut_html, markup=True)


def cut_html(text: str, limit: int = HTML_PIECE_CHARS) -> list[str]:
    """The document in pieces of at most `limit` characters where it can be cut: just before a block
    element's tag (or a comment or doctype) outside any element whose content is kept verbatim. A
    piece with no such place inside stays whole (and may be refused as too long)."""
    cuts, skip = [], []  # skip: open elements whose content is not translated (innermost last)
    for m in MARKUP.finditer(text):
        token = m.group(0)
        name, closing, void = tag_of(token)
        if skip:
            if name == skip[-1] and not void:
                skip.pop() if closing else skip.append(name)
            continue
        if name is None or name in BLOCK_TAGS:
            cuts.append(m.start())
        if not closing and not void and name is not None and (name in NEVER_TRANSLATED or NO_TRANSLATE.search(token)):
            skip.append(name)
    pieces, start, last = [], 0, 0
    for cut in cuts + [len(text)]:
        if cut - start > limit and last > start:
            pieces.append(text[start:last])
            start = last
        last = cut
    pieces.append(text[start:])
    return [p for p in pieces if p]
