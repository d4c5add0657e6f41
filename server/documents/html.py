"""text/html -> Plan: markup kept byte for byte, text translated sentence by sentence.

The markup is cut into tags, comments/doctype/CDATA and text by one regular
expression that respects quoted attribute values, so everything that is not
translated comes back exactly as sent (a parser that rebuilds tags would normalise
case, quotes and spacing). Block elements (p, div, li, td, br, h1...) end the run of
text being collected; inline elements (b, i, a, span, em...) stay inside it and are
handled like placeholders (server/documents/placeholders.py): the model reads the
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

from server.documents.plan import Plan, Unit
from server.documents.segment import plan_text

_MARKUP = re.compile(
    r"<!--.*?-->"                          # comment
    r"|<!\[CDATA\[.*?\]\]>"                # CDATA
    r"|<![^>]*>"                           # doctype
    r"|<\?.*?\?>"                          # processing instruction
    r"|</?[A-Za-z][\w:\-]*(?:\"[^\"]*\"|'[^']*'|[^'\">])*>",  # tag, quoted attribute values respected
    re.S)
_TAG_NAME = re.compile(r"</?([A-Za-z][\w:\-]*)")
_BLOCK = frozenset("""address article aside blockquote body br caption dd details dialog div dl dt fieldset
    figcaption figure footer form h1 h2 h3 h4 h5 h6 head header hr html li main nav ol optgroup option p section
    summary table tbody td tfoot th thead title tr ul meta link""".split())
_NEVER = frozenset("script style code pre textarea kbd samp var noscript template svg math".split())
_NO_TRANSLATE = re.compile(r"""\btranslate\s*=\s*["']?no\b|\bclass\s*=\s*["'][^"']*\bnotranslate\b""", re.I)
_VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())


def _tag(token: str) -> tuple[Optional[str], bool, bool]:
    """(lower-case name or None for comments etc., is an end tag, is self-closing)."""
    m = _TAG_NAME.match(token)
    if not m:
        return None, False, False
    name = m.group(1).lower()
    return name, token.startswith("</"), token.endswith("/>") or name in _VOID


def plan_html(text: str, split: str, language: str, fits: Callable[[str], bool]) -> Plan:
    plan, run = Plan(), []  # run: raw text and inline tags of the current block, in order
    skip: list[str] = []  # open elements whose content is kept verbatim (innermost last)

    def flush() -> None:
        if run:
            plan.extend(_translated_run("".join(run), split, language, fits))
            run.clear()

    pos = 0
    for m in _MARKUP.finditer(text):
        _text(text[pos:m.start()], run, plan, skip)
        pos = m.end()
        token = m.group(0)
        name, closing, void = _tag(token)
        if skip:
            plan.literal(token)
            if name == skip[-1] and not void:
                skip.pop() if closing else skip.append(name)
            continue
        if name is None or name in _BLOCK or name in _NEVER or (not closing and _NO_TRANSLATE.search(token)):
            flush()
            plan.literal(token)
            if not closing and not void and name is not None and (name in _NEVER or _NO_TRANSLATE.search(token)):
                skip.append(name)
        else:
            run.append(token)  # inline: travels with its sentence
    _text(text[pos:], run, plan, skip)
    flush()
    return plan


def _text(chunk: str, run: list[str], plan: Plan, skip: list[str]) -> None:
    if chunk:
        (plan.literal if skip else run.append)(chunk)


def _translated_run(raw: str, split: str, language: str, fits: Callable[[str], bool]) -> Plan:
    """A block's text with its inline tags: sentences as plain text, decoded entities for the
    model, the translation escaped again before the tags go back."""
    inner = plan_text(raw, split, language, fits, lines=False)  # in HTML a newline is a space
    out = Plan()
    for part in inner.parts:
        if isinstance(part, str):
            out.literal(part)
            continue
        restore = part.restore

        def finish(translation: str, restore=restore) -> str:
            escaped = html.escape(translation, quote=False)
            return restore(escaped) if restore else escaped
        source = re.sub(r"\s+", " ", html.unescape(part.source))  # the wrap of the HTML source is no layout
        out.unit(Unit(source, finish, part.original))
    return out
