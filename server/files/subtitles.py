"""SubRip subtitles (.srt) through the `srt` package: numbering, timings and cue settings kept.

Each subtitle is one segment. Its lines are one utterance more often than not ("I told you /
not to come"), so the line break travels inside the sentence as an inline atom and comes back at
the same relative word position (the subtitle keeps its number of lines). The tags subtitles carry
(<i>, <b>, <u>, <font color=...>) stay tags the markup planner keeps around their words, and ASS
override codes ({\\an8}) are atoms that come back where they were. The file's line endings and
byte order mark are kept; the numbering and the timings are written back as they were read.
"""
from __future__ import annotations

import html
import re

from server.files import Document
from server.files.checks import FileError, Limits, decode_text

_PIECE = re.compile(r"\{\\[^{}]*\}|</?[A-Za-z][^<>]*>")
_BACK = re.compile(r"<n/>|<t/>|<x(\d+)/>|</?[A-Za-z][^<>]*>")


def _segment(content: str) -> tuple[str, list[str]]:
    """(markup of a subtitle's text, its override codes in order)."""
    out, codes, pos = [], [], 0

    def text(raw: str) -> None:
        out.append(html.escape(raw, quote=False).replace("\r\n", "\n").replace("\n", "<n/>").replace("\t", "<t/>"))
    for m in _PIECE.finditer(content):
        text(content[pos:m.start()])
        if m.group(0).startswith("{"):
            out.append(f"<x{len(codes)}/>")
            codes.append(m.group(0))
        else:
            out.append(m.group(0))
        pos = m.end()
    text(content[pos:])
    return "".join(out), codes


def _content(translation: str, codes: list[str]) -> str:
    out, pos, used = [], 0, set()
    for m in _BACK.finditer(translation):
        out.append(html.unescape(translation[pos:m.start()]))
        token = m.group(0)
        if token == "<n/>":
            out.append("\n")
        elif token == "<t/>":
            out.append("\t")
        elif m.group(1) is not None:
            k = int(m.group(1))
            if k < len(codes) and k not in used:
                out.append(codes[k])
                used.add(k)
        else:
            out.append(token)
        pos = m.end()
    out.append(html.unescape(translation[pos:]))
    out += [c for k, c in enumerate(codes) if k not in used]
    # A subtitle's text never holds a blank line (it would end the subtitle) nor ends with a newline.
    return re.sub(r"\n\s*\n", "\n", "".join(out)).strip("\n") or " "


def read_srt(data: bytes, limits: Limits) -> Document:
    import srt
    text, encoding = decode_text(data, "srt")
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as e:
        raise FileError(f"Invalid file data: not a SubRip file ({str(e).splitlines()[0][:200]})") from None
    if not subtitles:
        raise FileError("Invalid file data: the srt file holds no subtitle")
    eol = "\r\n" if "\r\n" in text else "\n"
    marked = [_segment(s.content) for s in subtitles]
    kept = [i for i, (m, _) in enumerate(marked) if subtitles[i].content.strip()]

    def rebuild(translations: list[str], target: str) -> bytes:
        for i, translation in zip(kept, translations):
            subtitles[i].content = _content(translation, marked[i][1])
        return srt.compose(subtitles, reindex=False, eol=eol).encode(encoding)
    return Document([marked[i][0] for i in kept], rebuild)
