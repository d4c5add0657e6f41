"""Placeholders and inline tags: taken out before translation, put back exactly once after.

`{0}`, `{name}`, `{{var}}`, `%s`, `%(name)s` and tags such as `<b>`/`</b>` must reach
the output unchanged, each exactly once. Models copy such tokens unreliably: the shipped
Multi30k model turned "{color}" into "geschriebollter" and "<b>" into "Netetetetet"
(measured in docs/documents.md), and a sentinel such as "101" came back in only 4 of 8
sentences. So the model never sees them: they are removed, the clean sentence is
translated, and each one is reinserted at the same relative word position of the
translation (monotone, so "<b>" stays before "</b>"), keeping how it was attached to
its neighbours (glued to the next word, to the previous one, or standing alone).
Placement is a position heuristic, not an alignment; docs/documents.md measures how
often tags land on the right words. What this guarantees is the set: every placeholder
comes back, once, in the source order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

PLACEHOLDER = re.compile(
    r"\{\{\s*[\w.\-]+\s*\}\}"           # {{var}}
    r"|\{[\w.:!\-]*\}"                  # {0} {name} {}
    r"|%\([\w.\-]+\)[sdifrx]"           # %(name)s
    r"|%[sdifx]"                        # %s %d
    r"|</?[A-Za-z][\w\-]*(?:\s[^<>]*)?/?>"  # <b> </b> <br/> <a href="...">
)
_TRAILING_PUNCT = re.compile(r"[.!?…:;,]+[\"'”»)]*$")


@dataclass(frozen=True)
class Mark:
    text: str
    words_before: int  # words of the clean sentence before the placeholder
    glue_prev: bool  # no space between it and what precedes it
    glue_next: bool  # no space between it and the word that follows
    before_punct: bool  # directly followed by punctuation ("Hello {name}, ...")


def protect(sentence: str) -> tuple[str, Optional[Callable[[str], str]]]:
    """(clean sentence for the model, restore function or None when there was nothing to take out)."""
    matches = list(PLACEHOLDER.finditer(sentence))
    if not matches:
        return sentence, None
    clean, marks, pos = [], [], 0
    for m in matches:
        clean.append(sentence[pos:m.start()])
        before = "".join(clean)
        glue_prev = m.start() > 0 and not sentence[m.start() - 1].isspace()
        follower = sentence[m.end()] if m.end() < len(sentence) else " "
        glue_next = follower.isalnum() or follower in "<{%"
        before_punct = not glue_next and not follower.isspace()
        marks.append(Mark(m.group(0), len(before.split()), glue_prev, glue_next, before_punct))
        pos = m.end()
    clean.append(sentence[pos:])
    text = _tidy("".join(clean))
    if not text:  # only placeholders: nothing for the model
        return sentence, None
    n_words = len(text.split())
    return text, lambda translation: restore(translation, marks, n_words)


def _tidy(text: str) -> str:
    """Spaces a removal left behind: doubled, or before punctuation."""
    text = re.sub(r"\s{2,}", " ", text)
    return re.sub(r"\s+([,.;:!?…])", r"\1", text).strip()


def restore(translation: str, marks: list[Mark], source_words: int) -> str:
    words = translation.split()
    n = len(words)
    # Boundary b sits before words[b]; boundary n is the end. Monotone in the source order.
    slots: dict[int, list[Mark]] = {}
    last, last_words = 0, 0
    for mark in marks:
        b = round(mark.words_before * n / source_words) if source_words else n
        # Words between two marks in the source (an element's content) keep at least one word between
        # them in the translation, so "<b>dogs</b>" never comes back as an empty "<b></b>".
        b = min(max(b, last + (mark.words_before > last_words)), n)
        slots.setdefault(b, []).append(mark)
        last, last_words = b, mark.words_before
    out: list[str] = []
    for b in range(n + 1):
        prefix = ""  # marks glued to the word at this boundary, in source order
        for mark in slots.get(b, []):
            if prefix and b < n:  # after a mark glued to the next word, the rest follow it (order kept)
                prefix += mark.text if mark.glue_next or mark.glue_prev else " " + mark.text + " "
            elif mark.before_punct and not mark.glue_prev and out and _TRAILING_PUNCT.search(out[-1]):
                # "Hello {name}, ..." / "Hello {name}." -> before the punctuation, not after it
                word = out[-1]
                cut = _TRAILING_PUNCT.search(word).start()
                out[-1] = (word[:cut] + " " if cut else "") + mark.text + word[cut:]
            elif mark.glue_next and b < n:
                prefix += mark.text
            elif mark.glue_prev and out:
                out[-1] += mark.text
            else:
                out.append(mark.text)
        if b < n:
            out.append(prefix + words[b])
    return " ".join(out)
