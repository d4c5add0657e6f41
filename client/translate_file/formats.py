"""Formats: one input line -> a Unit (a text to translate, or a finished output line), and back.

Reads the input's records (text, JSONL, TSV, or the whole file as one text) and renders each
one's output line from its translation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from models.core.text import blank

from .settings import Settings, UsageError

MAX_ERROR_TEXT = 10_000  # characters of a failed text kept in its error record


@dataclass
class Unit:
    index: int  # 0-based input line
    text: Optional[str] = None  # to translate; None = `line` is final
    line: Optional[str] = None  # the output line (no newline) once known
    error: Optional[dict] = None  # set when the line failed
    state: Any = None  # what the format needs to render the line: the raw line, a parsed object
    render: Optional[Callable[[Optional[str]], str]] = None  # translation (None = failed) -> output line
    output_tokens: int = 0


def _flat(text: str, *, tabs: bool = False) -> str:
    """A translation on one line (and one TSV cell): line breaks (and tabs) become spaces."""
    for ch in ("\r\n", "\n", "\r", "\t") if tabs else ("\r\n", "\n", "\r"):
        text = text.replace(ch, " ")
    return text


def error_record(index: int, code: str, message: str, text: Optional[str]) -> dict:
    rec = {"line": index + 1, "code": code, "message": message}
    if text is not None:
        rec["text"] = text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "…"
    return rec


class TextFormat:
    def unit(self, index: int, raw: str) -> Unit:
        if blank(raw):
            return Unit(index, line=raw)
        return Unit(index, text=raw, render=lambda t: "" if t is None else _flat(t))


class JsonlFormat:
    def __init__(self, field: str, output_field: str):
        self.field, self.output_field = field, output_field

    def unit(self, index: int, raw: str) -> Unit:
        if blank(raw):
            return Unit(index, line=raw)
        try:
            obj = json.loads(raw)
        except ValueError as e:
            return Unit(index, line=raw, error=error_record(index, "BAD_INPUT", f"not JSON: {e}", None))
        if not isinstance(obj, dict):
            return Unit(index, line=raw, error=error_record(index, "BAD_INPUT", "not a JSON object", None))
        value = obj.get(self.field)
        problem = f"no field {self.field!r}" if self.field not in obj else \
            None if isinstance(value, str) else f"field {self.field!r} is not a string"
        if problem:
            obj[self.output_field] = None
            return Unit(index, line=self._dump(obj), error=error_record(index, "BAD_INPUT", problem, None))
        if blank(value):  # layout, as the server would give it back
            obj[self.output_field] = value
            return Unit(index, line=self._dump(obj))

        def render(t: Optional[str]) -> str:
            obj[self.output_field] = t  # None (null) when the line failed
            return self._dump(obj)
        return Unit(index, text=value, render=render)

    @staticmethod
    def _dump(obj: dict) -> str:
        return json.dumps(obj, ensure_ascii=False)  # escapes line breaks: one object stays one line


class TsvFormat:
    def __init__(self, column: int, header: bool, output_field: str):
        self.column, self.header, self.output_field = column, header, output_field

    def unit(self, index: int, raw: str) -> Unit:
        if index == 0 and self.header:
            return Unit(index, line=f"{raw}\t{self.output_field}")
        if not raw:
            return Unit(index, line=raw)
        cells = raw.split("\t")
        if self.column >= len(cells):
            return Unit(index, line=raw + "\t", error=error_record(
                index, "BAD_INPUT", f"row has {len(cells)} columns; --column is {self.column + 1}", raw))
        text = cells[self.column]
        if blank(text):  # layout, as the server would give it back
            return Unit(index, line=raw + "\t" + text)
        return Unit(index, text=text, render=lambda t: raw + "\t" + ("" if t is None else _flat(t, tabs=True)))


def tsv_column(s: Settings) -> int:
    """--column as a 0-based index; a name is looked up in the header (the input's first line)."""
    if s.column.isdigit():
        return int(s.column) - 1
    with open(s.input, "rb") as f:
        first = _decode(f.readline(), 0)
    names = first.split("\t")
    if s.column not in names:
        raise UsageError(f"--column {s.column!r} is not in the header: {names}")
    return names.index(s.column)


def _decode(raw: bytes, index: int) -> str:
    """One input line as text: without its line ending (\\n or \\r\\n), the file's BOM dropped."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    text = raw.decode("utf-8")
    return text[1:] if index == 0 and text.startswith("\ufeff") else text


def read_units(s: Settings, fmt, skip: int) -> Iterator[Unit]:
    with open(s.input, "rb") as f:
        for index, raw in enumerate(f):
            if index < skip:
                continue
            try:
                text = _decode(raw, index)
            except UnicodeDecodeError as e:
                yield Unit(index, line="", error=error_record(index, "BAD_INPUT", f"not UTF-8: {e}", None))
                continue
            yield fmt.unit(index, text)


def whole_file_unit(s: Settings) -> Unit:
    raw = s.input.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return Unit(0, line="", error=error_record(0, "BAD_INPUT", f"not UTF-8: {e}", None))
    if blank(text):
        return Unit(0, line=text.rstrip("\n"))
    return Unit(0, text=text, render=lambda t: "" if t is None else t.rstrip("\n"))


def input_format(s: Settings):
    """The format that turns s.input's lines into Units (a --column name is looked up here)."""
    return {"text": lambda: TextFormat(), "jsonl": lambda: JsonlFormat(s.field, s.output_field),
            "tsv": lambda: TsvFormat(tsv_column(s), s.header, s.output_field)}[s.format]()
