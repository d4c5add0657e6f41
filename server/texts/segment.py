"""Plain text -> Plan: sentences to translate, everything else kept byte for byte.

Lines are always boundaries (a newline never moves or disappears); within a line the
sentence segmenter finds sentences, and the whitespace around and between them stays
literal. Sentences are found by sentencex (Wikimedia's rule-based segmenter: ~250
languages, keeps every character, fast; docs/segmenters.md compares it with pysbd,
blingfire and syntok), then located in the line by sequential search, so the
segmenter can never drop or change a character of the document.

A sentence over the model's source budget is cut further, on the safest boundary that
fits (clause punctuation, then whitespace, then, for a single enormous "word",
characters), never truncated. A segment with nothing to translate (no letters, or only
a URL / e-mail address / placeholder) passes through unchanged. Whitespace means every
Unicode space (NBSP, U+2007, U+202F, U+3000...) and the invisible characters around it
(zero-width space and joiners, BOM, word joiner, soft hyphen, Hangul fillers): real
documents use them as spacers (`<td>&nbsp;</td>`, a blank-looking table cell), and a
segment made of nothing else is layout, not an empty sentence.
"""
from __future__ import annotations

import re
from typing import Callable

from sentencex import segment as sentencex_segment

from models.core.text import BLANK_CHARS, visible
from server.texts.placeholders import PLACEHOLDER, protect
from server.texts.plan import SPLIT_NEWLINES, SPLIT_OFF, Plan, Unit

_LINE = re.compile(r"(\r?\n)")
_EDGES = re.compile(rf"^({BLANK_CHARS}*)(.*?)({BLANK_CHARS}*)$", re.S)
_URLISH = re.compile(r"^(?:[a-z][\w+.-]*://\S+|www\.\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)$", re.I)
# sentencex splits after these (docs/segmenters.md: French "M.", "Dr.", "av. J.-C.", German "Hrn.",
# ordinals "im 19. Jahrhundert"): a sentence ending in one is joined to the next.
_ABBREVIATION_END = re.compile(
    r"(?:\b(?:M|MM|Mme|Mlle|Dr|Pr|Prof|Mr|Mrs|Ms|St|Ste|av|apr|env|cf|p|oct|nov|déc|janv|févr|Hr|Hrn|Fr|Nr|ca|"
    r"vgl|bzw|usw|z\.\s?B|d\.\s?h|c\.-à-d|J\.-C)\.)$")
_ORDINAL_END = re.compile(r"(?<![\d.,])\d{1,2}\.$")  # "am 3. Oktober": languages writing ordinals so
_ORDINAL_LANGUAGES = frozenset("de da no nb nn fi cs sk pl hu tr sl hr sr et lv lt is".split())
_CLAUSE_CUT = re.compile(r"[,;:)\]»”—–.!?…]+\s+")
_SPACE_CUT = re.compile(r"\s+")
# ISO 639-2/3 codes (NLLB's eng_Latn, M2M100's en) -> the 2-letter codes sentencex knows
_ISO3 = {"eng": "en", "deu": "de", "ger": "de", "fra": "fr", "fre": "fr", "spa": "es", "ita": "it", "por": "pt",
         "nld": "nl", "rus": "ru", "pol": "pl", "ces": "cs", "zho": "zh", "jpn": "ja", "kor": "ko", "ara": "ar"}


def segmenter_language(code: str) -> str:
    base = re.split(r"[_\-]", code or "en")[0].lower()
    return _ISO3.get(base, base) or "en"


def translatable(text: str) -> bool:
    """Letters that are not all inside a URL, an e-mail address or placeholders."""
    text = visible(text)
    if not any(c.isalpha() for c in text):
        return False
    rest = PLACEHOLDER.sub(" ", text).strip()
    return any(c.isalpha() for c in rest) and not _URLISH.match(rest)


def sentences(text: str, language: str) -> list[tuple[int, int]]:
    """(start, end) spans of the sentences in one line, trimmed, in order."""
    spans, pos = [], 0
    for found in sentencex_segment(language, text):
        piece = found.strip()
        if not piece:
            continue
        at = text.find(piece, pos)
        if at < 0:  # the segmenter changed the text: keep the rest as one sentence rather than lose it
            break
        previous = text[spans[-1][0]:spans[-1][1]] if spans else ""
        if previous and (_ABBREVIATION_END.search(previous)
                         or (language in _ORDINAL_LANGUAGES and _ORDINAL_END.search(previous))):
            spans[-1] = (spans[-1][0], at + len(piece))
        else:
            spans.append((at, at + len(piece)))
        pos = at + len(piece)
    rest = text[pos:].strip()
    if rest:
        at = text.index(rest, pos)
        spans.append((at, at + len(rest)))
    return spans


def cut_to_budget(sentence: str, fits: Callable[[str], bool]) -> list[str]:
    """Pieces of `sentence` (concatenated: the sentence) that each fit the token budget."""
    pieces, rest = [], sentence
    while not fits(rest):
        cut = _last_fitting_cut(rest, fits)
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)
    return pieces


def _last_fitting_cut(text: str, fits: Callable[[str], bool]) -> int:
    for pattern in (_CLAUSE_CUT, _SPACE_CUT):
        cuts = [m.end() for m in pattern.finditer(text) if 0 < m.end() < len(text)]
        best = _largest(cuts, lambda c: fits(text[:c]))
        if best:
            return best
    return _largest(list(range(1, len(text))), lambda c: fits(text[:c])) or 1


def _largest(sorted_cuts: list[int], ok: Callable[[int], bool]) -> int:
    """The largest cut with ok(cut), by binary search (a longer prefix never has fewer tokens)."""
    lo, hi, best = 0, len(sorted_cuts) - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if ok(sorted_cuts[mid]):
            best, lo = sorted_cuts[mid], mid + 1
        else:
            hi = mid - 1
    return best


def plan_text(text: str, split: str, language: str, fits: Callable[[str], bool], lines: bool = True,
              protect: Callable[[str], tuple] = protect) -> Plan:
    """The plan of a plain-text document. `fits(s)`: does `s` fit the model's source budget.
    `lines=False` (HTML, where a newline is just a space): a sentence may run over a line break;
    only blank lines and sentence ends separate sentences. `protect`: the placeholder step
    (HTML takes its inline tags out itself, knowing where they are)."""
    plan = Plan()
    if split == SPLIT_OFF:
        _add_span(plan, text, [(0, len(text))], fits, False, protect)
        return plan
    lang = segmenter_language(language)
    for line in (_LINE.split(text) if lines or split == SPLIT_NEWLINES else [text]):
        if not line or _LINE.fullmatch(line):
            plan.literal(line)
            continue
        lead, body, trail = _EDGES.match(line).groups()
        plan.literal(lead)
        spans = [(0, len(body))] if split == SPLIT_NEWLINES else sentences(body, lang)
        _add_span(plan, body, spans, fits, True, protect)
        plan.literal(trail)
    return plan


def _add_span(plan: Plan, text: str, spans: list[tuple[int, int]], fits: Callable[[str], bool], cut: bool,
              protect: Callable[[str], tuple]) -> None:
    pos = 0
    for start, end in spans:
        plan.literal(text[pos:start])
        _add_sentence(plan, text[start:end], fits, cut, protect)
        pos = end
    plan.literal(text[pos:])


def _add_sentence(plan: Plan, sentence: str, fits: Callable[[str], bool], cut: bool,
                  protect: Callable[[str], tuple]) -> None:
    lead, body, trail = _EDGES.match(sentence).groups()
    plan.literal(lead)
    if not translatable(body):
        plan.literal(body)
    else:
        for piece in (cut_to_budget(body, fits) if cut else [body]):
            lead, core, space = _EDGES.match(piece).groups()
            plan.literal(lead)
            if translatable(core):
                source, restore = protect(core)
                plan.unit(Unit(source, restore, core))
            else:  # a piece a cut left with nothing to translate
                plan.literal(core)
            plan.literal(space)
    plan.literal(trail)
