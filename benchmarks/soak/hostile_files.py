"""Bad and hostile document files: what tests/system/test_document_files.py sends once per API and the soak
sends over and over beside legal traffic (http_hostile.py, kind `file`).

Each case is (name, file name, bytes, the HTTP status DeepL's /v2/document answers, a pattern its message
matches). They cover what the readers in server/files/ must refuse before any work: a wrong or missing
extension, a format other than the extension says, zip bombs (an entry that inflates past the limit,
central-directory sizes that lie, thousands of entries), encryption (zip flags, an OLE container, an
encrypted ODF manifest), XML entity expansion and external entities (in Office parts, UTF-16 parts and
XLIFF), XML nested past any sane depth, broken XLIFF, SubRip and gettext, and a file over the size limit.
"""
from __future__ import annotations

import io
import struct
import zipfile

LAUGHS = (b'<?xml version="1.0"?><!DOCTYPE w [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
          b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>')
W_DOC = (b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
         b'<w:p><w:r><w:t>%s</w:t></w:r></w:p></w:body></w:document>')
XXE = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
X12 = (b'<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file original="a" source-language="en" '
       b'datatype="plaintext"><body><trans-unit id="1"><source>%s</source></trans-unit></body></file></xliff>')
ODT_MIME = b"application/vnd.oasis.opendocument.text"
OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # the container Office uses for a password-protected file


def zipped(entries: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        for name, body in entries.items():
            z.writestr(name, body)
    return buf.getvalue()


def with_part(data: bytes, name: str, body: bytes) -> bytes:
    """An Office file with one part replaced."""
    src = zipfile.ZipFile(io.BytesIO(data))
    return zipped({n: (body if n == name else src.read(n)) for n in src.namelist()})


def patched_central(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    """Every central-directory record of a zip with one field overwritten (flags, sizes)."""
    out = bytearray(data)
    at = out.find(b"PK\x01\x02")
    while at != -1:
        struct.pack_into(fmt, out, at + offset, value)
        at = out.find(b"PK\x01\x02", at + 4)
    return bytes(out)


def plain_docx() -> bytes:
    """A valid one-paragraph Word file (python-docx's template), for the cases that spoil one."""
    import docx
    doc = docx.Document()
    doc.add_paragraph("A man is riding a bike down the street.")
    buf = io.BytesIO()
    doc.save(buf)
    return buf.getvalue()


def plain_pptx() -> bytes:
    import pptx
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = "Two dogs play in the snow."
    buf = io.BytesIO()
    prs.save(buf)
    return buf.getvalue()


def cases(docx_ok: bytes | None = None, pptx_ok: bytes | None = None) -> list[tuple]:
    """(case, file name, content, HTTP status, message pattern) for DeepL's /v2/document."""
    docx_ok = docx_ok or plain_docx()
    pptx_ok = pptx_ok or plain_pptx()
    deep = b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>' + \
        b"<w:sdt><w:sdtContent>" * 3000 + b"</w:sdtContent></w:sdt>" * 3000 + b"</w:body></w:document>"
    parts = zipfile.ZipFile(io.BytesIO(docx_ok))
    return [
        ("unknown extension", "virus.exe", b"MZ\x90\x00", 400, "file extension"),
        ("no extension", "README", b"A man.", 400, "file extension"),
        ("empty file", "empty.txt", b"", 400, "empty"),
        ("pdf named docx", "a.docx", b"%PDF-1.7\n" + b"0" * 100, 400, "PDF"),
        ("random bytes named docx", "a.docx", bytes(range(256)) * 4, 400, "not a zip"),
        ("png named txt", "a.txt", b"\x89PNG\r\n\x1a\n" + b"\x00" * 50, 400, "PNG"),
        ("latin-1 text", "a.txt", "Ein Mann fährt.".encode("latin-1"), 400, "UTF-8"),
        ("NUL bytes in text", "a.txt", b"A man\x00 rides.", 400, "binary"),
        ("zip named html", "a.html", zipped({"a": b"x"}), 400, "zip"),
        ("zip named srt", "a.srt", zipped({"a": b"x"}), 400, "zip"),
        ("zip bomb entry", "a.docx", zipped({"[Content_Types].xml": b"<x/>", "word/document.xml": b"\0" * (20 << 20)}),
         400, "zip bomb"),
        ("declared sizes over the limit", "a.docx", patched_central(docx_ok, 24, "<I", 0x7FFFFFFF), 400,
         "inflates|zip bomb"),
        ("too many entries", "a.docx", zipped({f"f{k}.bin": b"" for k in range(6000)}, zipfile.ZIP_STORED), 400,
         "entries"),
        ("encrypted zip entries", "a.docx", patched_central(docx_ok, 8, "<H", 0x1), 400, "password-protected"),
        ("password-protected docx", "a.docx", OLE + b"\0" * 1000, 400, "password-protected"),
        ("password-protected xlsx", "a.xlsx", OLE + b"\0" * 1000, 400, "password-protected"),
        ("billion laughs in docx", "a.docx", with_part(docx_ok, "word/document.xml", LAUGHS + W_DOC % b"&d;"), 400,
         "DTD"),
        ("external entity in docx", "a.docx", with_part(docx_ok, "word/document.xml", XXE + W_DOC % b"&e;"), 400,
         "DTD"),
        ("DTD in a UTF-16 part", "a.docx", with_part(docx_ok, "word/document.xml",
                                                      (XXE + W_DOC % b"&e;").decode().encode("utf-16-le")),
         400, "DTD"),
        ("XML nested 3000 deep", "a.docx", with_part(docx_ok, "word/document.xml", deep), 400, "could not be read"),
        ("pptx named docx", "a.docx", pptx_ok, 400, "extension says docx"),
        ("docx named pptx", "a.pptx", docx_ok, 400, "extension says pptx"),
        ("docx named xlsx", "a.xlsx", docx_ok, 400, "extension says xlsx"),
        ("zip without content types", "a.docx", zipped({"word/document.xml": W_DOC % b"x"}), 400, "Content_Types"),
        ("docx without its document", "a.docx",
         zipped({n: parts.read(n) for n in parts.namelist() if n != "word/document.xml"}), 400, "lacks its main part"),
        ("ods named odt", "a.odt", zipped({"mimetype": b"application/vnd.oasis.opendocument.spreadsheet"}), 400,
         "extension says odt"),
        ("encrypted odt", "a.odt", zipped({"mimetype": ODT_MIME, "META-INF/manifest.xml":
                                           b"<manifest><file-entry><encryption-data/></file-entry></manifest>"}),
         400, "password-protected"),
        ("odt without mimetype", "a.odt", zipped({"content.xml": b"<x/>"}), 400, "mimetype"),
        ("billion laughs in xliff", "a.xlf", LAUGHS + X12 % b"&d;", 400, "entities"),
        ("external entity in xliff", "a.xliff", XXE + X12 % b"&e;", 400, "entities"),
        ("broken xliff", "a.xlf", b"<xliff><file>", 400, "well-formed"),
        ("html named xliff", "a.xlf", b"<html><body>A man.</body></html>", 400, "root element"),
        ("srt without timings", "a.srt", b"hello world, no subtitle here", 400, "SubRip"),
        ("po syntax error", "a.po", b'msgid "a\nmsgstr ""\n', 400, "could not be read|no entry"),
        ("po naming a server file", "a.po", b"/etc/passwd", 400, "could not be read|no entry"),
        ("file over the size limit", "big.txt", b"A man rides. " * (1 << 20), 413, "too large"),
    ]
