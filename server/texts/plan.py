"""A text as the scheduler sees it: the parts kept verbatim and the units to translate.

A text becomes a `Plan`: a sequence of literal strings (whitespace, layout, markup,
segments with nothing to translate) and `Unit`s (one sentence each, translated as its
own row of the continuous batch). Rendering puts each unit's translation back in its
place, so the layout around the sentences survives byte for byte. No protobuf and no
tensors here: the service builds plans from texts and renders them from finished jobs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


# split_sentences values (the API's enum, as plain strings past the service edge)
SPLIT_ON, SPLIT_OFF, SPLIT_NEWLINES = "on", "off", "newlines"
MIME_PLAIN, MIME_HTML = "text/plain", "text/html"


@dataclass
class Unit:
    """One sentence (or sentence piece) to translate."""
    source: str  # what the model reads
    # translation -> the text put back in the document (placeholders or inline tags restored);
    # None: the translation as it is. A unit with a restore step streams whole, once finished.
    restore: Optional[Callable[[str], str]] = None
    original: str = ""  # the text as it stood in the document (placeholders, tags, entities and all)

    def finish(self, translation: str) -> str:
        return self.restore(translation) if self.restore else translation


@dataclass
class Plan:
    parts: list[str | Unit] = field(default_factory=list)

    def literal(self, text: str) -> None:
        if not text:
            return
        if self.parts and isinstance(self.parts[-1], str):
            self.parts[-1] += text
        else:
            self.parts.append(text)

    def unit(self, unit: Unit) -> None:
        self.parts.append(unit)

    def extend(self, other: "Plan") -> None:
        for part in other.parts:
            self.literal(part) if isinstance(part, str) else self.unit(part)

    @property
    def units(self) -> list[Unit]:
        return [p for p in self.parts if isinstance(p, Unit)]

    def render(self, translations: list[str]) -> str:
        """The document with translation i in place of unit i."""
        it = iter(translations)
        return "".join(p if isinstance(p, str) else p.finish(next(it)) for p in self.parts)


@dataclass(frozen=True)
class DocumentOptions:
    split: str = SPLIT_ON
    mime_type: str = MIME_PLAIN

    def problems(self) -> list[str]:
        problems = []
        if self.split not in (SPLIT_ON, SPLIT_OFF, SPLIT_NEWLINES):
            problems.append(f"split_sentences must be on, off or newlines (got {self.split!r})")
        if self.mime_type not in (MIME_PLAIN, MIME_HTML):
            problems.append(f"mime_type must be {MIME_PLAIN} or {MIME_HTML} (got {self.mime_type!r})")
        return problems

