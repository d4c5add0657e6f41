"""Word, PowerPoint and Excel files: python-docx and python-pptx open and save the package, the
paragraph engine (server/files/ooxml.py) changes the runs' text; Excel's strings are changed in place.

* .docx: every paragraph of the body (tables and text boxes included), the headers and footers,
  footnotes, endnotes and comments. python-docx keeps every part it does not model byte for byte.
* .pptx: every paragraph of the slides (shapes, groups, tables), their speaker notes, charts and
  SmartArt text; slide masters and layouts are not translated (their placeholder prompts).
* .xlsx: the shared strings (plain or rich text), inline strings, comments and the text of drawings
  and charts. openpyxl loads a workbook into its own model and writes that model back, dropping what
  it does not model (shapes, text boxes, form controls, slicers, VBA); so the archive is rewritten
  entry by entry here, only the changed XML parts replaced, and openpyxl reads the result in the tests.

Before any library opens a file, checks.open_zip has bounded the archive and refused DTDs and
encryption, and the package's main content type must be the extension's (a .pptx named .docx is
refused as the wrong type, not half-read).
"""
from __future__ import annotations

import io
import zipfile

from lxml import etree

from server.files import Document
from server.files.checks import FileError, Limits, open_zip, read_entry
from server.files.markup import escape, text_of
from server.files.ooxml import XML_SPACE, Dialect, Paragraph, paragraphs

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
X = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
WORD = Dialect(run=W + "r", text=W + "t", props=W + "rPr", first=frozenset({W + "pPr"}), last=frozenset(),
               containers=frozenset({W + "hyperlink", W + "smartTag", W + "ins", W + "customXml", W + "moveTo"}),
               preserve_space=True)
DRAWING = Dialect(run=A + "r", text=A + "t", props=A + "rPr", first=frozenset({A + "pPr"}),
                  last=frozenset({A + "endParaRPr"}), containers=frozenset(), preserve_space=False)
CELLS = Dialect(run=X + "r", text=X + "t", props=X + "rPr", first=frozenset(),
                last=frozenset({X + "rPh", X + "phoneticPr"}), containers=frozenset(), preserve_space=True)

OOXML = "application/vnd.openxmlformats-officedocument."
MAIN = {"docx": OOXML + "wordprocessingml.document.main+xml",
        "pptx": OOXML + "presentationml.presentation.main+xml",
        "xlsx": OOXML + "spreadsheetml.sheet.main+xml"}
WORD_PARTS = {OOXML + "wordprocessingml." + k + "+xml" for k in
              ("document.main", "header", "footer", "footnotes", "endnotes", "comments")}
SLIDE_PARTS = {OOXML + k for k in ("presentationml.slide+xml", "presentationml.notesSlide+xml",
                                   "drawingml.chart+xml", "drawingml.diagramData+xml")} | \
    {"application/vnd.ms-office.drawingml.diagramDrawing+xml"}
SHEET_PARTS = {OOXML + k for k in ("spreadsheetml.sharedStrings+xml", "spreadsheetml.worksheet+xml",
                                   "spreadsheetml.comments+xml", "drawing+xml", "drawingml.chart+xml")}
PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False, remove_blank_text=False)


def content_types(archive: zipfile.ZipFile, kind: str) -> dict[str, str]:
    """Entry name -> content type, from [Content_Types].xml; the package's main type must be `kind`'s."""
    try:
        root = etree.fromstring(read_entry(archive, "[Content_Types].xml", kind), PARSER)
    except KeyError:
        raise FileError(f"Invalid file data: not a {kind} file (no [Content_Types].xml)") from None
    defaults = {e.get("Extension", "").lower(): e.get("ContentType", "") for e in root if e.tag.endswith("Default")}
    overrides = {e.get("PartName", "").lstrip("/"): e.get("ContentType", "") for e in root
                 if e.tag.endswith("Override")}
    types = {}
    for name in archive.namelist():
        types[name] = overrides.get(name) or defaults.get(name.rsplit(".", 1)[-1].lower(), "")
    declared = [name for name, t in overrides.items() if t == MAIN[kind]]
    if not declared:
        found = next((t for t in overrides.values() if t.endswith(".main+xml")), "none")
        raise FileError(f"Invalid file data: the file extension says {kind}, but the package is {found!r}")
    if declared[0] not in types:
        raise FileError(f"Invalid file data: the {kind} package lacks its main part {declared[0][:80]!r}")
    return types


class _Parts:
    """The XML roots of a python-docx/python-pptx package's parts of some content types, parsed or as the
    library holds them, and how to store each back (a part the library keeps as bytes gets new bytes)."""

    def __init__(self, package, wanted: set[str]):
        self.roots, self.loose = [], []
        for part in package.iter_parts():
            if part.content_type not in wanted:
                continue
            element = getattr(part, "_element", None)
            if element is None:
                element = etree.fromstring(part.blob, PARSER)
                self.loose.append((part, element))
            self.roots.append(element)

    def store(self) -> None:
        for part, element in self.loose:
            part._blob = etree.tostring(element, xml_declaration=True, encoding="UTF-8", standalone=True)


def _document(paras: list[Paragraph], save) -> Document:
    kept = [p for p in paras if p.segment() is not None]

    def rebuild(translations: list[str], target: str) -> bytes:
        for p, t in zip(kept, translations):
            p.put(t)
        return save()
    return Document([p.segment() for p in kept], rebuild)


def read_docx(data: bytes, limits: Limits) -> Document:
    import docx
    return _read_package(data, limits, "docx", docx.Document, WORD_PARTS, W + "p", WORD)


def read_pptx(data: bytes, limits: Limits) -> Document:
    import pptx
    return _read_package(data, limits, "pptx", pptx.Presentation, SLIDE_PARTS, A + "p", DRAWING)


def _read_package(data: bytes, limits: Limits, kind: str, load, part_names, paragraph_tag: str, ns) -> Document:
    """A Word or PowerPoint file through its library (`load`, python-docx's Document or python-pptx's
    Presentation): the paragraphs of its text parts, saved back by the library."""
    content_types(open_zip(data, kind, limits), kind)
    opened = load(io.BytesIO(data))
    parts = _Parts(opened.part.package, part_names)
    paras = [p for root in parts.roots for p in paragraphs(root, paragraph_tag, ns)]

    def save() -> bytes:
        parts.store()
        out = io.BytesIO()
        opened.save(out)
        return out.getvalue()
    return _document(paras, save)


class _PlainCell:
    """A string of one <t> (a shared string or inline string without runs): the Paragraph interface."""

    def __init__(self, t: etree._Element):
        self.t = t

    def segment(self):
        return escape(self.t.text) if (self.t.text or "").strip() else None

    def put(self, translation: str) -> None:
        text = text_of(translation)
        self.t.text = text
        if text != text.strip():
            self.t.set(XML_SPACE, "preserve")


def read_xlsx(data: bytes, limits: Limits) -> Document:
    archive = open_zip(data, "xlsx", limits)
    types = content_types(archive, "xlsx")
    roots: dict[str, etree._Element] = {}
    paras: list = []
    for info in archive.infolist():
        kind = types.get(info.filename, "")
        if kind not in SHEET_PARTS:
            continue
        root = etree.fromstring(read_entry(archive, info, "xlsx"), PARSER)
        roots[info.filename] = root
        if kind.endswith(("drawing+xml", "chart+xml")):
            paras += paragraphs(root, A + "p", DRAWING)
            continue
        for element in root.iter(X + "si", X + "is", X + "text"):
            bare = element.find(X + "t")
            paras.append(_PlainCell(bare) if bare is not None else Paragraph(element, CELLS))

    def save() -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for info in archive.infolist():
                if info.filename in roots:
                    body = etree.tostring(roots[info.filename], xml_declaration=True, encoding="UTF-8",
                                          standalone=True)
                else:
                    body = read_entry(archive, info, "xlsx")
                z.writestr(info, body, compress_type=info.compress_type)
        return out.getvalue()
    return _document(paras, save)
