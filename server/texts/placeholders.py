"""Placeholders and inline tags: taken out before translation, put back exactly once after.

`{0}`, `{name}`, `{{var}}`, `%s`, `%(name)s` and tags such as `<b>`/`</b>` must reach
the output unchanged, each exactly once. Models copy such tokens unreliably: the shipped
Multi30k model turned "{color}" into "geschriebollter" and "<b>" into "Netetetetet"
(measured in docs/documents.md), and a sentinel such as "101" came back in only 4 of 8
sentences. So the model never sees them: they are removed, the clean sentence is
translated, and each one is reinserted at the same relative word position of the
translation (monotone, so "<b>" stays before "</b>"), keeping how it was attached to
its neighbours (glued to the next word, to the previous one, or standing alone); an
element whose wrapped word is recognisably in the translation (a name, a number, a
cognate) moves onto it. Placement is a heuristic, not an alignment; docs/documents.md
measures how often tags land on the right words. What this guarantees is the set: every placeholder
comes back, once, in the source order.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

_TEXT_PLACEHOLDER = (
    r"\{\{\s*[\w.\-]+\s*\}\}"           # {{var}}
    r"|\{[\w.:!\-]*\}"                  # {0} {name} {}
    r"|%\([\w.\-]+\)[sdifrx]"           # %(name)s
    r"|%[sdifx]"                        # %s %d
)
PLACEHOLDER = re.compile(_TEXT_PLACEHOLDER + r"|</?[A-Za-z][\w\-]*(?:\s[^<>]*)?/?>")  # <b> </b> <br/> <a href="...">
_TRAILING_PUNCT = re.compile(r"[.!?…:;,]+[\"'”»)]*$")


@dataclass(frozen=True)
class Mark:
    text: str
    words_before: int  # words of the clean sentence before the placeholder
    glue_prev: bool  # no space between it and what precedes it
    glue_next: bool  # no space between it and the word that follows
    before_punct: bool  # directly followed by punctuation ("Hello {name}, ...")


def protect(sentence: str, sentinel: str = "", atoms: Sequence[str] = ()) -> tuple[str, Optional[Callable[[str], str]]]:
    """(clean sentence for the model, restore function or None when there was nothing to take out).

    HTML passes its inline tags as `atoms`, each standing in the sentence as one `sentinel`
    character (the tags were found by the HTML scanner, which no placeholder pattern can second-
    guess); the k-th sentinel comes back as atoms[k]. Text that merely looks like a tag there
    (a decoded "&lt;b&gt;") is text, so only the non-tag placeholders are matched beside them."""
    pattern = re.compile(_TEXT_PLACEHOLDER + "|" + re.escape(sentinel)) if sentinel else PLACEHOLDER
    matches = list(pattern.finditer(sentence))
    if not matches:
        return sentence, None
    starts = {m.start() for m in matches}
    atom = iter(atoms)
    clean, marks, pos = [], [], 0
    for m in matches:
        clean.append(sentence[pos:m.start()])
        before = "".join(clean)
        glue_prev = m.start() > 0 and not sentence[m.start() - 1].isspace()
        follower = sentence[m.end()] if m.end() < len(sentence) else " "
        glue_next = follower.isalnum() or m.end() in starts
        before_punct = not glue_next and not follower.isspace()
        text = next(atom) if sentinel and m.group(0) == sentinel else m.group(0)
        marks.append(Mark(text, len(before.split()), glue_prev, glue_next, before_punct))
        pos = m.end()
    clean.append(sentence[pos:])
    text = _tidy("".join(clean))
    if not text:  # only placeholders: nothing for the model
        return sentence, None
    words = text.split()
    return text, lambda translation: restore(translation, marks, words)


def _tidy(text: str) -> str:
    """Spaces a removal left behind: doubled, or before punctuation."""
    text = re.sub(r"\s{2,}", " ", text)
    return re.sub(r"\s+([,.;:!?…])", r"\1", text).strip()


def _boundaries(marks: list[Mark], source_words: int, n: int) -> list[int]:
    """Each mark's boundary in the translation (b sits before word b; n is the end): the same
    relative position, monotone in the source order."""
    out, last, last_words = [], 0, 0
    for mark in marks:
        b = round(mark.words_before * n / source_words) if source_words else n
        # Words between two marks in the source (an element's content) keep at least one word between
        # them in the translation, so "<b>dogs</b>" never comes back as an empty "<b></b>".
        b = min(max(b, last + (mark.words_before > last_words)), n)
        out.append(b)
        last, last_words = b, mark.words_before
    return out


def _bare(word: str) -> str:
    return re.sub(r"\W+", "", word.lower())


def _anchor(marks: list[Mark], bounds: list[int], source: list[str], target: list[str]) -> None:
    """Move an element onto the translated word it wraps when that word is recognisably the same
    (names, numbers, cognates: "guitar" ~ "Gitarre", "helmet" ~ "Helm"), keeping the order of all
    marks; otherwise its relative position stands."""
    opened: dict[str, list[int]] = {}
    bare_target = [_bare(w) for w in target]
    for i, mark in enumerate(marks):
        name = re.match(r"</?([A-Za-z][\w\-]*)", mark.text)
        if not name:
            continue
        if not mark.text.startswith("</"):
            opened.setdefault(name.group(1).lower(), []).append(i)
            continue
        starts = opened.get(name.group(1).lower())
        if not starts:
            continue
        a = starts.pop()
        if marks[a].words_before == 0 and mark.words_before >= len(source):
            continue  # it wraps the whole sentence: so it wraps the whole translation, where it already stands
        inner = [_bare(w) for w in source[marks[a].words_before:mark.words_before] if len(_bare(w)) >= 3]
        best, at = 0.0, -1
        for j, word in enumerate(bare_target):
            if len(word) < 3:  # "in", "a": too short to be recognisably anything
                continue
            for w in inner:
                score = difflib.SequenceMatcher(None, w, word).ratio()
                if score > best or (score == best and abs(j - bounds[a]) < abs(at - bounds[a])):
                    best, at = score, j
        if best < 0.6:
            continue
        span = min(mark.words_before - marks[a].words_before, len(target) - at)
        # The marks inside the element (a nested element's tags) move with it, at their offsets within it.
        inner = [min(max(b - bounds[a] + at, at), at + span) for b in bounds[a + 1:i]]
        moved = bounds[:a] + [at] + inner + [at + span] + bounds[i + 1:]
        if all(x <= y for x, y in zip(moved, moved[1:])):
            bounds[:] = moved


def restore(translation: str, marks: list[Mark], source: list[str]) -> str:
    words = translation.split()
    n = len(words)
    bounds = _boundaries(marks, len(source), n)
    _anchor(marks, bounds, source, words)
    slots: dict[int, list[Mark]] = {}
    for mark, b in zip(marks, bounds):
        slots.setdefault(b, []).append(mark)
    out: list[str] = []
    for b in range(n + 1):
        prefix = ""  # marks glued to the word at this boundary, in source order
        for mark in slots.get(b, []):
            if prefix and b < n:  # after a mark glued to the next word, the rest follow it (order kept)
                if mark.glue_next or mark.glue_prev:  # the space after the last of a glued run stays
                    prefix += mark.text if mark.glue_next else mark.text + " "
                else:
                    prefix += " " + mark.text + " "
            elif mark.before_punct and not mark.glue_prev and out and _TRAILING_PUNCT.search(out[-1]):
                # "Hello {name}, ..." / "Hello {name}." -> before the punctuation, not after it
                word = out[-1]
                cut = _TRAILING_PUNCT.search(word).start()
                out[-1] = (word[:cut] + " " if cut else "") + mark.text + word[cut:]
            elif mark.glue_next and b < n:
                prefix += mark.text
            elif mark.glue_prev and out:
                tail = _TRAILING_PUNCT.search(out[-1]) if mark.before_punct else None
                if tail and tail.start():  # "<b>horse</b>." -> "<b>Pferd</b>.", not "Pferd.</b>"
                    out[-1] = out[-1][:tail.start()] + mark.text + out[-1][tail.start():]
                else:
                    out[-1] += mark.text
            else:
                out.append(mark.text)
        if b < n:
            out.append(prefix + words[b])
    return " ".join(out)
