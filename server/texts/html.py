"""text/html -> Plan: markup kept byte for byte, text translated sentence by sentence.

The markup is cut into tags, comments/doctype/CDATA and text by one regular
expression that respects quoted attribute values, so everything that is not
translated comes back exactly as sent (a parser that rebuilds tags would normalise
case, quotes and spacing). Block elements (p, div, li, td, br, h1...) end the run of
text being collected; inline elements (b, i, a, span, em...) stay inside it and are
handled like placeholders (server/texts/placeholders.py): the model reads the
clean sentence, the tags come back once each, in order, at the same relative word
positions — so the output is as well-formed as the input. Text inside script, style,
code, pre, textarea, and inside any element with translate="no" or class
"notranslate", is never translated. A newline in HTML text is a space: a sentence
hard-wrapped over several source lines is one sentence. Entities are decoded for the model and the
translation is escaped again (&, <, >), so "&amp;" stays "&amp;"; a named entity such
as &eacute; inside translated text comes back as its character.
"""
from __future__ import annotations

import html
import re
from typing import Callable, Optional

from server.texts.placeholders import protect
from server.texts.plan import Plan, Unit
from server.texts.segment import plan_text

MARKUP = re.compile(
    r"<!--.*?-->"                          # comment
    r"|<!\[CDATA\[.*?\]\]>"                # CDATA
    r"|<![^>]*>"                           # doctype
    r"|<\?.*?\?>"                          # processing instruction
    r"|</?[A-Za-z][\w:\-]*(?:\"[^\"]*\"|'[^']*'|[^'\">])*>",  # tag, quoted attribute values respected
    re.S)
TAG_NAME = re.compile(r"</?([A-Za-z][\w:\-]*)")
BLOCK_TAGS = frozenset("""address article aside blockquote body br caption dd details dialog div dl dt fieldset
    figcaption figure footer form h1 h2 h3 h4 h5 h6 head header hr html li main nav ol optgroup option p section
    summary table tbody td tfoot th thead title tr ul meta link""".split())
NEVER_TRANSLATED = frozenset("script style code pre textarea kbd samp var noscript template svg math".split())
NO_TRANSLATE = re.compile(r"""\btranslate\s*=\s*["']?no\b|\bclass\s*=\s*["'][^"']*\bnotranslate\b""", re.I)
# Character references, terminated by ";" (the form html.unescape decodes whole).
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())


def tag_of(token: str) -> tuple[Optional[str], bool, bool]:
    """(lower-case name or None for comments etc., is an end tag, is self-closing)."""
    m = TAG_NAME.match(token)
    if not m:
        return None, False, False
    name = m.group(1).lower()
    return name, token.startswith("</"), token.endswith("/>") or name in _VOID


def plan_html(text: str, split: str, language: str, fits: Callable[[str], bool]) -> Plan:
    plan, run = Plan(), _Run()  # run: raw text and inline tags of the current block, in order
    skip: list[str] = []  # open elements whose content is kept verbatim (innermost last)

    def flush() -> None:
        if run.pieces:
            plan.extend(run.plan(split, language, fits))
            run.pieces.clear()

    pos = 0
    for m in MARKUP.finditer(text):
        _text(text[pos:m.start()], run, plan, skip)
        pos = m.end()
        token = m.group(0)
        name, closing, void = tag_of(token)
        if skip:
            plan.literal(token)
            if name == skip[-1] and not void:
                skip.pop() if closing else skip.append(name)
            continue
        if name is None or name in BLOCK_TAGS or name in NEVER_TRANSLATED or (not closing and NO_TRANSLATE.search(token)):
            flush()
            plan.literal(token)
            if not closing and not void and name is not None and (name in NEVER_TRANSLATED or NO_TRANSLATE.search(token)):
                skip.append(name)
        else:
            run.pieces.append((True, token))  # inline: travels with its sentence
    _text(text[pos:], run, plan, skip)
    flush()
    return plan


def _text(chunk: str, run: "_Run", plan: Plan, skip: list[str]) -> None:
    if chunk:
        plan.literal(chunk) if skip else run.pieces.append((False, chunk))


class _Run:
    """A block's text with its inline tags -> sentences for the model, markup kept exactly.

    The run is first read as the reader sees it: entities decoded (so "&nbsp;" is a space,
    and a "&nbsp;"-only cell is blank, not the letters n-b-s-p) and each inline tag standing
    as one private-use character that no segmenter, cut or placeholder pattern can split.
    That view is segmented like plain text; every part of the result is then mapped back to
    the raw characters it came from, so literals stay byte for byte and each sentence gets its
    own tags back (server/texts/placeholders.py): every tag exactly once, in source order,
    whatever the model returns."""

    def __init__(self) -> None:
        self.pieces: list[tuple[bool, str]] = []  # (is an inline tag, raw text)

    def plan(self, split: str, language: str, fits: Callable[[str], bool]) -> Plan:
        raw_all = "".join(raw for _, raw in self.pieces)
        sentinel = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in raw_all)
        view, raws, tags = [], [], []  # view char i was raws[i] in the source ("" for a second decoded char)
        for is_tag, raw in self.pieces:
            if is_tag:
                view.append(sentinel)
                raws.append(raw)
                tags.append(raw)
                continue
            pos = 0
            for m in _ENTITY.finditer(raw):
                for ch in raw[pos:m.start()]:
                    view.append(ch)
                    raws.append(ch)
                decoded = html.unescape(m.group(0))
                view.extend(decoded)
                raws.extend([m.group(0)] + [""] * (len(decoded) - 1))
                pos = m.end()
            for ch in raw[pos:]:
                view.append(ch)
                raws.append(ch)
        text = "".join(view)

        def view_fits(piece: str) -> bool:
            return fits(_model_text(piece.replace(sentinel, " ")))
        inner = plan_text(text, split, language, view_fits, lines=False, protect=lambda core: (core, None))
        out, at, tag_at = Plan(), 0, 0
        for part in inner.parts:
            piece = part if isinstance(part, str) else part.original
            raw = "".join(raws[at:at + len(piece)])
            own = tags[tag_at:tag_at + piece.count(sentinel)]
            at, tag_at = at + len(piece), tag_at + len(own)
            if isinstance(part, str):
                out.literal(raw)
                continue
            clean, restore = protect(piece, sentinel, own)
            if sentinel in piece and restore is None:  # nothing but tags and placeholders: layout
                out.literal(raw)
                continue

            def finish(translation: str, restore=restore) -> str:
                escaped = html.escape(translation.replace(sentinel, ""), quote=False)
                return restore(escaped) if restore else escaped
            out.unit(Unit(_model_text(clean), finish, raw))
        return out


def _model_text(text: str) -> str:
    """What the model reads: the wrap of the HTML source is no layout."""
    return re.sub(r"\s+", " ", text).strip()
