"""Document files: each format read into segments to translate, and written back with only the text changed.

    document = read("report.docx", data)        # checks first (server/files/checks.py), then the library
    translations = [...]                        # one per document.segments[i], same kind (markup or plain)
    data = document.rebuild(translations, "de")

Formats and the library that reads and writes each (docs/documents.md, "Files", says why each):

| extensions                | format                       | read and written with                            |
|---------------------------|------------------------------|--------------------------------------------------|
| .txt                      | plain text                   | the standard library                             |
| .html .htm                | HTML                         | the server's own markup planner (kept byte for byte) |
| .docx                     | Word                         | python-docx                                      |
| .pptx                     | PowerPoint                   | python-pptx                                      |
| .xlsx                     | Excel                        | zipfile + lxml (openpyxl drops shapes on save)   |
| .odt .odp .ods            | OpenDocument                 | odfpy                                            |
| .srt                      | SubRip subtitles             | srt                                              |
| .xlf .xliff               | XLIFF 1.2 and 2.x            | translate-toolkit                                |
| .po .pot                  | gettext catalogues           | polib                                            |

A segment is markup (server/files/markup.py: formatting runs as `<gN>` groups, fixed pieces as
`<xN/>` atoms, text escaped) to be translated as text/html, except for plain text files, whose
segments are plain text (`Document.markup` False).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import PurePath
from typing import Callable

from server.files.checks import LIMITS, FileError, Limits, check_size
from server.files.markup import text_of

__all__ = ["Document", "FileError", "Format", "FORMATS", "LIMITS", "Limits", "format_of", "read", "extensions"]


@dataclass
class Document:
    segments: list[str]
    rebuild: Callable[[list[str], str], bytes]  # (translations in segment order, target language) -> the file
    markup: bool = True  # segments are markup (text/html) rather than plain text

    def texts(self) -> list[str]:
        """Each segment's text alone (tags dropped, entities decoded): what is billed and detected."""
        return [text_of(s) for s in self.segments] if self.markup else list(self.segments)


@dataclass(frozen=True)
class Format:
    name: str
    extensions: tuple[str, ...]
    media_type: str
    reader: str  # "module:function" under server.files: (data, limits) -> Document


FORMATS = [
    Format("txt", (".txt",), "text/plain; charset=utf-8", "text:read_text"),
    Format("html", (".html", ".htm"), "text/html; charset=utf-8", "text:read_html"),
    Format("docx", (".docx",), "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
           "office:read_docx"),
    Format("pptx", (".pptx",), "application/vnd.openxmlformats-officedocument.presentationml.presentation",
           "office:read_pptx"),
    Format("xlsx", (".xlsx",), "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
           "office:read_xlsx"),
    Format("odt", (".odt",), "application/vnd.oasis.opendocument.text", "odf:read_odt"),
    Format("odp", (".odp",), "application/vnd.oasis.opendocument.presentation", "odf:read_odp"),
    Format("ods", (".ods",), "application/vnd.oasis.opendocument.spreadsheet", "odf:read_ods"),
    Format("srt", (".srt",), "application/x-subrip; charset=utf-8", "subtitles:read_srt"),
    Format("xliff", (".xlf", ".xliff"), "application/xliff+xml", "xliff:read_xliff"),
    Format("po", (".po", ".pot"), "text/x-gettext-translation; charset=utf-8", "po:read_po"),
]
_BY_EXTENSION = {ext: f for f in FORMATS for ext in f.extensions}


def extensions() -> list[str]:
    return [ext for f in FORMATS for ext in f.extensions]


def format_of(filename: str) -> Format:
    """The format a file name's extension names; FileError for any other (DeepL's and LibreTranslate's
    clients match "Invalid file" / "file extension" in the message)."""
    ext = PurePath(filename or "").suffix.lower()
    found = _BY_EXTENSION.get(ext)
    if found is None:
        shown = repr(ext) if ext else "none"
        raise FileError(f"Invalid file: the file extension {shown[:40]} is not supported (supported: "
                        f"{', '.join(extensions())})")
    return found


def read(filename: str, data: bytes, limits: Limits = LIMITS) -> Document:
    """The document in `data`, every check passed; FileError (its message for the caller) otherwise.
    A library's own error on a damaged or hostile file is a FileError too, never an exception of its own."""
    fmt = format_of(filename)
    check_size(data, limits)
    module, _, function = fmt.reader.partition(":")
    reader = getattr(importlib.import_module(f"server.files.{module}"), function)
    try:
        document = reader(data, limits)
    except FileError:
        raise
    except RecursionError:
        raise FileError(f"Invalid file data: the {fmt.name} file nests too deeply") from None
    except Exception as e:  # noqa: BLE001 (whatever a library raises on a damaged file)
        raise FileError(f"Invalid file data: the {fmt.name} file could not be read ({type(e).__name__}: "
                        f"{str(e)[:200]})") from None
    if len(document.segments) > limits.max_segments:
        raise FileError(f"File too large: {len(document.segments)} texts to translate; the limit is "
                        f"{limits.max_segments}")
    characters = sum(map(len, document.texts()))
    if characters > limits.max_characters:
        raise FileError(f"File too large: {characters} characters to translate; the limit is "
                        f"{limits.max_characters}")
    return document
