"""OpenDocument files (.odt, .odp, .ods) through odfpy: paragraphs and headings, their spans kept.

odfpy loads the package (content, styles with the headers and footers of the page styles, meta,
settings; pictures and other entries are kept as they are) into its element tree and saves it back.
Every text:p and text:h is a segment (server/files/markup.py): a text:span or a text:a is a group
whose inside is read the same way (the span keeps its style, the link its target), and everything
else inside a paragraph (spaces text:s, tabs, line breaks, frames, notes, bookmarks, fields) is an
atom moved back into place. A note's or a frame's own paragraphs are segments of their own.

Before odfpy reads a byte: checks.open_zip (entry count, sizes, ratios, no DTD in any XML part), the
archive's `mimetype` entry must be the extension's, and a manifest that lists encryption data (a
password-protected document) is refused.
"""
from __future__ import annotations

import io
from typing import Optional

from server.files import Document
from server.files.checks import FileError, Limits, open_zip, read_entry
from server.files.markup import Atom, Builder, Node, ids, parse

TEXT_NS = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
PARAGRAPHS = {(TEXT_NS, "p"), (TEXT_NS, "h")}
GROUPS = {(TEXT_NS, "span"), (TEXT_NS, "a")}
MIMETYPES = {"odt": "application/vnd.oasis.opendocument.text",
             "odp": "application/vnd.oasis.opendocument.presentation",
             "ods": "application/vnd.oasis.opendocument.spreadsheet"}
MAX_DEPTH = 16


def _check(data: bytes, kind: str, limits: Limits) -> None:
    archive = open_zip(data, kind, limits)
    try:
        mimetype = read_entry(archive, "mimetype", kind).decode("ascii", "replace").strip()
    except KeyError:
        raise FileError("Invalid file data: not an OpenDocument file (no mimetype entry)") from None
    if mimetype != MIMETYPES[kind]:
        raise FileError(f"Invalid file data: the file extension says {kind}, but the document is {mimetype[:80]!r}")
    try:
        manifest = read_entry(archive, "META-INF/manifest.xml", kind)
    except KeyError:
        manifest = b""
    if b"encryption-data" in manifest:
        raise FileError(f"Invalid file data: this {kind} file is password-protected: save it without a password")


class _Paragraph:
    def __init__(self, element):
        self.element = element
        self.table: dict[int, object] = {}
        self.builder = Builder("br")
        self._read(element, 0)

    def _read(self, element, depth: int) -> None:
        for child in element.childNodes:
            if child.nodeType == child.TEXT_NODE:
                self.builder.text(child.data)
            elif child.nodeType == child.ELEMENT_NODE and child.qname in GROUPS and depth < MAX_DEPTH:
                ident = self._new(child)
                self.builder.open(ident)
                self._read(child, depth + 1)
                self.builder.close(ident)
            else:
                self.builder.atom(self._new(child))

    def _new(self, node) -> int:
        self.table[len(self.table)] = node
        return len(self.table) - 1

    def segment(self) -> Optional[str]:
        return self.builder.markup() if self.builder.has_text() else None

    def put(self, translation: str) -> None:
        nodes = parse(translation)
        groups, atoms = ids(nodes)
        group_ids = {i for i, n in self.table.items() if getattr(n, "qname", None) in GROUPS}
        nodes += [Atom(i) for i in self.table if i not in group_ids and i not in atoms and i not in groups]
        self._write(self.element, nodes)

    def _write(self, element, nodes: list[Node]) -> None:
        children: list = []
        self._collect(nodes, children)
        _set_children(element, children)

    def _collect(self, nodes: list[Node], children: list) -> None:
        from odf.element import Text
        for node in nodes:
            if isinstance(node, str):
                if node:
                    children.append(Text(node))
            elif isinstance(node, Atom):
                if node.id in self.table:
                    children.append(self.table[node.id])
            elif node.id in self.table:  # a span or a link, its inside rebuilt the same way
                inner = self.table[node.id]
                self._write(inner, node.children)
                children.append(inner)
            else:  # an id never written: keep the text
                self._collect(node.children, children)


def _set_children(element, children: list) -> None:
    """Replace an element's children in odfpy's tree without its removeChild/appendChild: those update
    the document's element caches, which its writer reads to decide which automatic styles are used
    (a span moved out and back would lose its style)."""
    element.childNodes[:] = []
    previous = None
    for child in children:
        child.__dict__["parentNode"] = element
        child.__dict__["previousSibling"] = previous
        child.__dict__["nextSibling"] = None
        if previous is not None:
            previous.__dict__["nextSibling"] = child
        element.childNodes.append(child)
        previous = child


def _read(data: bytes, kind: str, limits: Limits) -> Document:
    from odf.opendocument import load
    _check(data, kind, limits)
    doc = load(io.BytesIO(data))
    found = []
    for qname in PARAGRAPHS:
        found += doc.element_dict.get(qname, [])
    paras = [_Paragraph(e) for e in found]
    kept = [p for p in paras if p.segment() is not None]

    def rebuild(translations: list[str], target: str) -> bytes:
        for p, t in zip(kept, translations):
            p.put(t)
        out = io.BytesIO()
        doc.save(out)
        return out.getvalue()
    return Document([p.segment() for p in kept], rebuild)


def read_odt(data: bytes, limits: Limits) -> Document:
    return _read(data, "odt", limits)


def read_odp(data: bytes, limits: Limits) -> Document:
    return _read(data, "odp", limits)


def read_ods(data: bytes, limits: Limits) -> Document:
    return _read(data, "ods", limits)
