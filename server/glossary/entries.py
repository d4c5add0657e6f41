"""Glossary entries as DeepL takes them: TSV or CSV text in, validated (source, target) pairs out.

DeepL's rules, which its client libraries also check before sending (deepl-python's
`util.validate_glossary_term` and `convert_tsv_to_dict`):
  * one entry a line; TSV: `source<TAB>target`, exactly one tab; CSV (RFC 4180 quoting):
    `source,target` or `source,target,source_lang,target_lang` (the languages, when given, must
    be the dictionary's); blank lines are skipped;
  * each term is trimmed of spaces, then must be non-empty, hold no C0 (U+0000-U+001F) or C1
    (U+0080-U+009F) control character and no Unicode line or paragraph separator (U+2028, U+2029),
    and be at most 1024 UTF-8 bytes;
  * no source term twice in one dictionary (the exact string; DeepL's "duplicates key");
  * a glossary's entries are at most 10 MiB (10485760 bytes) in all; its name 1 to 1024 UTF-8 bytes.
Refusals are `GlossaryError`s carrying DeepL's status and message ("Invalid glossary entries
provided", with a detail naming the entry) for server/edge/http/glossaries.py to send as they are.
"""
from __future__ import annotations

import csv
import io
from typing import Iterable, Optional

# The languages DeepL's glossaries take (its OpenAPI description's GlossarySourceLanguage, 2025), lower
# case as its API answers them. A served language outside this list is a glossary language here too.
GLOSSARY_LANGUAGES = ("ar", "bg", "cs", "da", "de", "el", "en", "es", "et", "fi", "fr", "he", "hu", "id", "it",
                      "ja", "ko", "lt", "lv", "nb", "nl", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "th", "tr",
                      "uk", "vi", "zh")
MAX_TERM_BYTES = 1024
MAX_NAME_BYTES = 1024
MAX_GLOSSARY_BYTES = 10 * 1024 * 1024
FORMATS = ("tsv", "csv")
_TRIM = " \t\u00a0"  # what a term is trimmed of; any other invisible character is checked, not dropped

Entries = list[tuple[str, str]]


class GlossaryError(Exception):
    """A refusal in DeepL's terms: `status` (400, 404, 413, 415, 456), `message` and an optional `detail`."""

    def __init__(self, status: int, message: str, detail: str = ""):
        super().__init__(message + (f" ({detail})" if detail else ""))
        self.status, self.message, self.detail = status, message, detail

    def body(self) -> dict:
        return {"message": self.message, **({"detail": self.detail} if self.detail else {})}


def bad_entries(detail: str) -> GlossaryError:
    return GlossaryError(400, "Invalid glossary entries provided", detail)


def _bad_character(term: str) -> Optional[str]:
    for ch in term:
        code = ord(ch)
        if code <= 0x1F or 0x80 <= code <= 0x9F or ch in "\u2028\u2029":
            return f"U+{code:04X}"
    return None


def check_term(term: str, where: str) -> str:
    """The term trimmed, or a GlossaryError naming `where` ("entry 3 source term")."""
    term = term.strip(_TRIM)
    if not term:
        raise bad_entries(f"{where} is empty")
    bad = _bad_character(term)
    if bad:
        raise bad_entries(f"{where} contains the control character {bad}")
    size = len(term.encode("utf-8"))
    if size > MAX_TERM_BYTES:
        raise bad_entries(f"{where} is {size} UTF-8 bytes long; the limit is {MAX_TERM_BYTES}")
    return term


def check_entries(pairs: Iterable[tuple[str, str, int]]) -> Entries:
    """(source, target, line) -> validated entries in order: terms checked, no source twice."""
    out: Entries = []
    seen: dict[str, int] = {}
    for index, (source, target, line) in enumerate(pairs):
        source = check_term(source, f"entry {index + 1} (line {line}): the source term")
        target = check_term(target, f"entry {index + 1} (line {line}): the target term")
        if source in seen:
            raise bad_entries(f"Key with the index {index} (line {line}) duplicates key with the index "
                              f"{seen[source]}: {source[:64]!r}")
        seen[source] = index
        out.append((source, target))
    return out


def parse_tsv(text: str) -> Entries:
    def rows():
        for line, raw in enumerate(text.split("\n"), 1):
            raw = raw[:-1] if raw.endswith("\r") else raw
            if not raw.strip(_TRIM):
                continue
            if raw.count("\t") != 1:
                raise bad_entries(f"line {line} must hold one source and one target term separated by one tab; "
                                  f"it has {raw.count(chr(9))} tabs")
            source, target = raw.split("\t")
            yield source, target, line
    return check_entries(rows())


def parse_csv(text: str, source_lang: str, target_lang: str) -> Entries:
    def rows():
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        try:
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip(_TRIM)):
                    continue
                if len(row) not in (2, 4):
                    raise bad_entries(f"line {line} has {len(row)} fields; CSV entries have 2 (source, target) or "
                                      "4 (source, target, source language, target language)")
                if len(row) == 4:
                    langs = (row[2].strip().lower(), row[3].strip().lower())
                    if langs != (source_lang, target_lang):
                        raise bad_entries(f"line {line} names the languages {row[2]!r}, {row[3]!r}; the dictionary "
                                          f"is {source_lang}->{target_lang}")
                yield row[0], row[1], line
        except csv.Error as e:
            raise bad_entries(f"the CSV does not parse at line {reader.line_num}: {e}") from None
    return check_entries(rows())


def parse_entries(text: object, entries_format: object, source_lang: str, target_lang: str) -> Entries:
    """`entries` as sent, in `entries_format` ("tsv", the default, or "csv") -> validated entries."""
    fmt = "tsv" if entries_format is None else entries_format
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise GlossaryError(400, f"Value for 'entries_format' not supported: {str(fmt)[:32]!r} (tsv or csv)")
    if not isinstance(text, str):
        raise GlossaryError(400, "Parameter 'entries' not specified." if text is None else
                            "Value for 'entries' not supported: the entries must be a string")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GLOSSARY_BYTES:
        raise too_large(size)
    entries = parse_csv(text, source_lang, target_lang) if fmt.lower() == "csv" else parse_tsv(text)
    if not entries:
        raise bad_entries("the dictionary holds no entries")
    return entries


def too_large(size: int) -> GlossaryError:
    return GlossaryError(413, "Request Entity Too Large",
                         f"the glossary's entries are {size} bytes; the limit is {MAX_GLOSSARY_BYTES} bytes")


def to_tsv(entries: Entries) -> str:
    """DeepL's TSV answer: one `source<TAB>target` a line, no trailing newline."""
    return "\n".join(f"{s}\t{t}" for s, t in entries)


def from_tsv(text: str) -> Entries:
    """Stored (already validated) TSV -> entries, unchecked."""
    return [tuple(line.split("\t", 1)) for line in text.split("\n") if line]  # type: ignore[misc]


def tsv_bytes(entries: Entries) -> int:
    return len(to_tsv(entries).encode("utf-8"))


def check_name(name: object) -> str:
    if name is None:
        raise GlossaryError(400, "Parameter 'name' not specified.")
    if not isinstance(name, str):
        raise GlossaryError(400, "Value for 'name' not supported: the name must be a string")
    if not name.strip():
        raise GlossaryError(400, "Value for 'name' not supported: the name must not be empty")
    bad = _bad_character(name)
    if bad:
        raise GlossaryError(400, f"Value for 'name' not supported: it contains the control character {bad}")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise GlossaryError(400, f"Value for 'name' not supported: {size} UTF-8 bytes; the limit is {MAX_NAME_BYTES}")
    return name


def language(code: object, what: str, extra: Iterable[str] = ()) -> str:
    """A glossary language code as sent ("EN", "en", "EN-GB") -> DeepL's lower-case base code."""
    if code is None or code == "":
        raise GlossaryError(400, f"Parameter '{what}' not specified.")
    if not isinstance(code, str):
        raise GlossaryError(400, f"Value for '{what}' not supported: the language must be a string")
    base = code.strip().split("-")[0].split("_")[0].lower()
    if base not in GLOSSARY_LANGUAGES and base not in set(extra):
        raise GlossaryError(400, f"Value for '{what}' not supported: {code[:16]!r} is not a glossary language "
                            "(GET /v2/glossary-language-pairs lists the pairs)")
    return base


def language_pair(source: object, target: object, extra: Iterable[str] = ()) -> tuple[str, str]:
    extra = tuple(extra)
    pair = language(source, "source_lang", extra), language(target, "target_lang", extra)
    if pair[0] == pair[1]:
        raise GlossaryError(400, "Unsupported glossary source and target language pair",
                            f"{pair[0]}->{pair[1]}: the source and target languages must differ")
    return pair
