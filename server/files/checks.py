"""What a file must pass before any work is spent on it: size, type, archive and XML safety.

Every check runs on the bytes as uploaded, before a format library parses them:

* size: at most `Limits.max_file_bytes`;
* type: the extension names the format, and the content must be that format (its magic bytes, the
  archive's entries for Office and OpenDocument files, text that decodes for the text formats): a
  PDF renamed .docx or a PNG renamed .txt is refused, not handed to a parser;
* archives (zip bombs): entry count, the sum of the sizes the entries declare and each entry's
  compression ratio are bounded. Python's zipfile never inflates an entry past its declared size
  (it raises on a longer stream or a bad CRC), so the declared sizes bound what any library reads;
* XML (entity expansion, external entities): no XML part of an Office or OpenDocument archive has a
  DTD, so any part with a DOCTYPE is refused; standalone XML (XLIFF) is parsed once by defusedxml,
  which refuses entity declarations and external references, before its library reads it;
* encryption: a password-protected Office file is an OLE compound file (EncryptedPackage), an
  encrypted OpenDocument file lists encryption data in its manifest, and a zip entry may carry the
  encryption flag: each is refused as password-protected.
"""
from __future__ import annotations

import codecs
import io
import re
import zipfile
from dataclasses import dataclass


class FileError(ValueError):
    """A file refused before or while it is read: the message is for the caller."""


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = 10 << 20  # the upload as sent
    max_entries: int = 5_000  # entries of an Office or OpenDocument archive
    max_unzipped_bytes: int = 100 << 20  # sum of the entries' declared sizes
    max_ratio: int = 200  # uncompressed / compressed, for an entry over 1 MiB
    max_segments: int = 20_000  # texts to translate in one file
    max_characters: int = 2_000_000  # characters to translate in one file


LIMITS = Limits()

OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # compound file: legacy .doc/.xls/.ppt, or an encrypted OOXML file
ZIP = b"PK\x03\x04"
EMPTY_ZIP = b"PK\x05\x06"
# What some other file type starts with: such content under a text extension is refused.
BINARY_MAGIC = {ZIP: "a zip archive", OLE: "an OLE compound file", b"%PDF": "a PDF file",
                b"\x89PNG": "a PNG image", b"GIF8": "a GIF image", b"\xff\xd8\xff": "a JPEG image",
                b"\x1f\x8b": "gzip data", b"7z\xbc\xaf": "a 7-zip archive", b"Rar!": "a RAR archive",
                b"\x7fELF": "an executable", b"MZ": "a Windows executable"}
_DOCTYPE = [re.compile(re.escape("<!DOCTYPE".encode(e)), re.I) for e in ("utf-8", "utf-16-le", "utf-16-be")] + \
    [re.compile(re.escape("<!DOCTYPE".encode(e))) for e in ("utf-32-le", "utf-32-be")]


def check_size(data: bytes, limits: Limits = LIMITS) -> None:
    if not data:
        raise FileError("Invalid file data: the file is empty")
    if len(data) > limits.max_file_bytes:
        raise FileError(f"File too large: {len(data)} bytes; the limit is {limits.max_file_bytes}")


def what_binary(data: bytes) -> str | None:
    """The kind of binary file `data` starts like, or None."""
    for magic, name in BINARY_MAGIC.items():
        if data.startswith(magic):
            return name
    return None


def open_zip(data: bytes, kind: str, limits: Limits = LIMITS) -> zipfile.ZipFile:
    """The archive of an Office or OpenDocument file, its entries checked (count, sizes, ratios,
    encryption, no DTD in any XML part). `kind` names the format in messages."""
    if data.startswith(OLE):
        raise FileError(f"Invalid file data: this {kind} file is password-protected or encrypted (or an old binary "
                        "Office file): save it without a password, in the current format")
    if not data.startswith((ZIP, EMPTY_ZIP)):
        found = what_binary(data)
        raise FileError(f"Invalid file data: the file extension says {kind}, but the content is "
                        f"{found or 'not a zip archive'}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as e:
        raise FileError(f"Invalid file data: a damaged {kind} archive ({e})") from None
    if len(entries) > limits.max_entries:
        raise FileError(f"Invalid file data: {len(entries)} entries in the archive; the limit is {limits.max_entries}")
    total = 0
    for entry in entries:
        if entry.flag_bits & 0x1:
            raise FileError(f"Invalid file data: this {kind} file is password-protected (encrypted entry "
                            f"{entry.filename[:80]!r})")
        total += entry.file_size
        if entry.file_size > 1 << 20 and entry.file_size > limits.max_ratio * max(entry.compress_size, 1):
            raise FileError(f"Invalid file data: entry {entry.filename[:80]!r} inflates {entry.compress_size} "
                            f"bytes to {entry.file_size} (a zip bomb?)")
    if total > limits.max_unzipped_bytes:
        raise FileError(f"Invalid file data: the archive inflates to {total} bytes; the limit is "
                        f"{limits.max_unzipped_bytes}")
    for entry in entries:
        if entry.filename.lower().endswith((".xml", ".rels")) or entry.filename.lower() == "[content_types].xml":
            check_part(read_entry(archive, entry, kind), entry.filename)
    return archive


def read_entry(archive: zipfile.ZipFile, entry, kind: str = "archive") -> bytes:
    try:
        return archive.read(entry)
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, ValueError, EOFError, OSError,
            zipfile.LargeZipFile) as e:
        # RuntimeError: an encrypted entry; NotImplementedError: a compression method zipfile lacks.
        name = getattr(entry, "filename", entry)
        raise FileError(f"Invalid file data: entry {str(name)[:80]!r} of the {kind} archive cannot be read "
                        f"({type(e).__name__}: {e})") from None


def check_part(data: bytes, name: str) -> None:
    """An XML part of an archive: Office and OpenDocument parts never carry a DTD, so a DOCTYPE (where
    entities would be declared: billion laughs, external entities) is refused outright."""
    if any(p.search(data) for p in _DOCTYPE):
        raise FileError(f"Invalid file data: the XML part {name[:80]!r} declares a DTD (entity declarations "
                        "are not accepted)")


def check_xml(data: bytes, kind: str) -> None:
    """A standalone XML file, parsed once by defusedxml: entity declarations, external entities and
    external DTDs are refused; a file that is not well-formed XML is refused."""
    from xml.etree.ElementTree import ParseError

    import defusedxml.ElementTree as safe
    from defusedxml import DefusedXmlException
    try:
        safe.fromstring(data)
    except DefusedXmlException:
        raise FileError(f"Invalid file data: the {kind} file declares entities or refers to external ones "
                        "(not accepted)") from None
    except (ParseError, ValueError) as e:
        raise FileError(f"Invalid file data: not well-formed XML ({e})") from None


def decode_text(data: bytes, kind: str) -> tuple[str, str]:
    """(text, encoding) of a text format: UTF-8 (a BOM kept in the encoding's name: utf-8-sig) or
    UTF-16 with its BOM. Binary content (another file type's magic bytes, NUL bytes) is refused."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and not data.startswith(codecs.BOM_UTF32_LE):
        encoding = "utf-16"
    else:
        found = what_binary(data)
        if found:
            raise FileError(f"Invalid file data: the file extension says {kind}, but the content is {found}")
        encoding = "utf-8-sig" if data.startswith(codecs.BOM_UTF8) else "utf-8"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        raise FileError(f"Invalid file data: a {kind} file must be UTF-8 (or UTF-16 with a byte order mark); "
                        f"byte {e.start} is not") from None
    if "\x00" in text:
        raise FileError(f"Invalid file data: the file extension says {kind}, but the content is binary")
    return text, encoding
