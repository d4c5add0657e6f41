"""Where a dictionary's source terms occur in a sentence, and what the translation must then contain.

Matching works on word tokens, not characters: a run of letters and digits is one token, every
other visible character (punctuation, symbols) is one, and so is each character of the scripts
written without spaces (Han, kana, Thai), so "Δぁ" is found in running Japanese text. A term
matches where its tokens stand in the sentence one after the other (whitespace between them
does not matter), compared case-insensitively (str.casefold); as the tokens are whole words, a
term is never found inside a longer word ("cat" is not in "category"). Scanning left to right,
the longest term wins at each position and its words are not matched again (leftmost-longest:
"New York City" before "New York", and "York" inside it is not a second match); among terms
of the same length, one whose casing equals the sentence's wins ("US" over "us" for "US").

For each match the translation must contain the target term: `terms_for` turns the matched
entries into the token sequences the scheduler enforces (server/core/terms.py), each
with the variant a sentence-initial word would take (the first letter upper-cased), and keeps
the matches themselves for the response's glossary hits.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from models.core.tokenizer import normalize
from server.core.terms import WORD_MARK, written
from server.glossary.entries import Entries
from server.glossary.store import Dictionary

_SCRIPTIO = "\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Thai, kana, Han
_TOKEN = re.compile(rf"[{_SCRIPTIO}]|(?:(?![{_SCRIPTIO}])[^\W_])+|[^\w\s]|_")


def words(text: str) -> list[re.Match]:
    return list(_TOKEN.finditer(text))


@dataclass(frozen=True)
class Match:
    source: str  # the glossary's source term
    target: str  # the glossary's target term
    start: int  # where it stands in the sentence (characters)
    end: int


class Matcher:
    """A dictionary's source terms, indexed by their first word (casefolded)."""

    def __init__(self, entries: Entries):
        self.entries = entries
        index: dict[str, list[tuple[tuple[str, ...], tuple[str, ...], int]]] = {}
        for i, (source, _) in enumerate(entries):
            tokens = tuple(m.group(0) for m in words(source))
            if not tokens:
                continue
            folded = tuple(t.casefold() for t in tokens)
            index.setdefault(folded[0], []).append((folded, tokens, i))
        for candidates in index.values():  # longest first; entry order among equals (stable sort)
            candidates.sort(key=lambda c: -len(c[0]))
        self.index = index

    def find(self, sentence: str) -> list[Match]:
        found = words(sentence)
        tokens = [m.group(0) for m in found]
        folded = [t.casefold() for t in tokens]
        out: list[Match] = []
        i = 0
        while i < len(tokens):
            best: Optional[tuple[int, int]] = None  # (entry, length)
            for key, original, entry in self.index.get(folded[i], ()):
                n = len(key)
                if best is not None and n < best[1]:
                    break  # shorter than a match found: longest wins
                if tuple(folded[i:i + n]) != key:
                    continue
                if best is None:
                    best = (entry, n)
                if tuple(tokens[i:i + n]) == original:  # the same casing as the sentence wins a tie
                    best = (entry, n)
                    break
            if best is None:
                i += 1
                continue
            entry, n = best
            source, target = self.entries[entry]
            out.append(Match(source, target, found[i].start(), found[i + n - 1].end()))
            i += n
        return out


def matcher_of(dictionary: Dictionary) -> Matcher:
    found = dictionary.compiled.get("matcher")
    if found is None:
        found = dictionary.compiled["matcher"] = Matcher(dictionary.entries)
    return found


def variants(target: str) -> list[str]:
    """The forms of a target term the translation may show: as written, and with its first letter
    upper-cased (a sentence-initial word) when that differs."""
    forms = [target]
    if target[:1].islower() and target[:1].upper() != target[:1]:
        forms.append(target[:1].upper() + target[1:])
    return forms


# Punctuation a tokenizer may merge into a word's last piece ("▁Straße." is one token of the shipped
# German model): a term written so is written all the same.
MERGED = (".", ",", "!", "?", ";", ":", ")", "\"", "'", "...", ".\"", "),", ").")


def _spellings(tok, ids: tuple[int, ...]) -> list[tuple[int, ...]]:
    """A form's token sequence, and the same with punctuation merged into its last token."""
    out = [ids]
    token_id = getattr(tok, "token_id", None)
    if token_id is None:
        return out
    last = tok.piece(ids[-1])
    for mark in MERGED:
        merged = token_id(last + mark)
        if merged is not None:
            out.append(ids[:-1] + (merged,))
    return out


def _glued(tok, ids: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """The form glued to what precedes it ("T-shirt", "d'hommes"): its first piece without the word mark."""
    token_id = getattr(tok, "token_id", None)
    first = tok.piece(ids[0])
    if token_id is None or not first.startswith(WORD_MARK) or len(first) < 2:
        return None
    bare = token_id(first[1:])
    return (bare,) + ids[1:] if bare is not None else None


def term_tokens(tok, target: str, unk_id: Optional[int], cache: Optional[dict] = None) -> tuple:
    """The target term as a constraint (server/core/terms.py): (its spellings as written, its other
    forms' spellings, its text forms). A form the tokenizer cannot spell (an unknown token in it) is
    left out; a term whose form as written is unspellable is () and is reported, never forced."""
    key = ("tokens", id(tok), target)
    if cache is not None and key in cache:
        return cache[key]
    groups: list[list[tuple[int, ...]]] = [[], []]
    seen: set[tuple[int, ...]] = set()
    forms = variants(normalize(target))
    for k, form in enumerate(forms):
        ids = tuple(tok.encode_target(form))
        if not ids or (unk_id is not None and unk_id in ids):
            continue
        glued = _glued(tok, ids)
        for group, spelled in [(min(k, 1), s) for s in _spellings(tok, ids)] + \
                ([(1, s) for s in _spellings(tok, glued)] if glued else []):
            if spelled not in seen:
                seen.add(spelled)
                groups[group].append(spelled)
    result = (tuple(groups[0]), tuple(groups[1]), tuple(forms)) if groups[0] else ()
    if cache is not None:
        cache[key] = result
    return result


def terms_for(sentences: Sequence[str], matcher: Matcher, tok, unk_id: Optional[int],
              cache: Optional[dict] = None) -> tuple[list[tuple], list[list[Match]]]:
    """Per sentence: (the constraints a job enforces: one per distinct target term, each a tuple of
    token-sequence variants; the matches, in sentence order)."""
    constraints, matches = [], []
    for sentence in sentences:
        found = matcher.find(sentence)
        seen, terms = set(), []
        for m in found:
            if m.target in seen:
                continue
            seen.add(m.target)
            spelled = term_tokens(tok, m.target, unk_id, cache)
            if spelled:
                terms.append(spelled)
        constraints.append(tuple(terms))
        matches.append(found)
    return constraints, matches


def appears(target: str, translation: str) -> bool:
    """Whether the translation shows the target term (any of its forms) as whole words."""
    return any(written(translation, form, final=True) for form in variants(normalize(target)))
