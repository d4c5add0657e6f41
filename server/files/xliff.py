"""XLIFF 1.2 and 2.x (.xlf, .xliff) through translate-toolkit: each unit's source into its target.

translate-toolkit parses the file (its own lxml parser, entities unresolved; checks.check_xml has
refused entity declarations before) and names the translatable units: 1.2 trans-units and 2.x
segments, those marked translate="no" skipped. The source's inline elements are kept: paired
ones (1.2 g and mrk, 2.x pc and mrk) are groups the markup planner keeps around their words,
the others (x, bx, ex, ph, bpt, ept, it; ph, sc, ec, cp, sm, em) atoms; each comes back in the
target once, as in the source. The target keeps its attributes (state, state-qualifier, approved)
or is created right after the source; notes, alt-trans, groups and every other element stay as they
are, and the tree is written back as parsed (not re-indented as translate-toolkit's own writer
does). The file's target language is set (1.2 `target-language` on each file, 2.x `trgLang`).
"""
from __future__ import annotations

import copy
from typing import Optional

from lxml import etree

from server.files import Document
from server.files.checks import FileError, Limits, check_xml
from server.files.markup import Atom, Builder, Group, Node, ids, parse

GROUPS = {"g", "mrk", "pc"}
MAX_DEPTH = 16


def _local(tag) -> str:
    return etree.QName(tag).localname if isinstance(tag, str) else ""


class _Unit:
    def __init__(self, element: etree._Element):
        self.element = element
        self.ns = etree.QName(element).namespace
        self.source = element.find(f"{{{self.ns}}}source")
        self.table: dict[int, etree._Element] = {}
        self.builder = Builder("br")
        if self.source is not None:
            self._read(self.source, 0)

    def _read(self, element: etree._Element, depth: int) -> None:
        self.builder.text(element.text or "")
        for child in element:
            ident = len(self.table)
            self.table[ident] = child
            if _local(child.tag) in GROUPS and depth < MAX_DEPTH:
                self.builder.open(ident)
                self._read(child, depth + 1)
                self.builder.close(ident)
            else:
                self.builder.atom(ident)
            self.builder.text(child.tail or "")

    def segment(self) -> Optional[str]:
        return self.builder.markup() if self.builder.has_text() else None

    def put(self, translation: str) -> None:
        target = self.element.find(f"{{{self.ns}}}target")
        if target is None:
            after = self.element.find(f"{{{self.ns}}}seg-source")
            after = after if after is not None else self.source
            target = etree.Element(f"{{{self.ns}}}target")
            after.addnext(target)
            target.tail = after.tail  # the indentation the source had before what followed it
        for child in list(target):
            target.remove(child)
        target.text = None
        nodes = parse(translation)
        groups, atoms = ids(nodes)  # an atom that did not come back (never expected) is kept at the end
        nodes += [Atom(i) for i, e in self.table.items() if i not in atoms | groups and _local(e.tag) not in GROUPS]
        self._write(target, nodes)

    def _write(self, element: etree._Element, nodes: list[Node]) -> None:
        for node in nodes:
            if isinstance(node, str):
                _append_text(element, node)
            elif isinstance(node, Atom) and node.id in self.table:
                element.append(_shallow(self.table[node.id], deep=True))
            elif isinstance(node, Group) and node.id in self.table:
                inner = _shallow(self.table[node.id], deep=False)
                element.append(inner)
                self._write(inner, node.children)
            elif isinstance(node, Group):
                self._write(element, node.children)


def _shallow(element: etree._Element, deep: bool) -> etree._Element:
    copied = copy.deepcopy(element) if deep else element.makeelement(element.tag, dict(element.attrib))
    copied.tail = None
    return copied


def _append_text(element: etree._Element, text: str) -> None:
    if not text:
        return
    if len(element):
        element[-1].tail = (element[-1].tail or "") + text
    else:
        element.text = (element.text or "") + text


def read_xliff(data: bytes, limits: Limits) -> Document:
    from translate.storage import xliff, xliff2
    check_xml(data, "xliff")
    root = etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))
    if _local(root.tag) != "xliff":
        raise FileError(f"Invalid file data: the file extension says xliff, but the root element is "
                        f"<{_local(root.tag)[:40]}>")
    version2 = (root.get("version") or "").startswith("2")
    store = (xliff2.Xliff2File if version2 else xliff.xlifffile).parsestring(data)
    units = [_Unit(u.xmlelement) for u in store.units if u.istranslatable() and not u.isheader()]
    kept = [u for u in units if u.segment() is not None]
    document = store.document
    encoding = document.docinfo.encoding or "UTF-8"
    declaration = data[:data.index(b"?>") + 2] if data.startswith(b"<?xml") and b"?>" in data[:200] else b""

    def rebuild(translations: list[str], target: str) -> bytes:
        for unit, translation in zip(kept, translations):
            unit.put(translation)
        top = document.getroot()
        if target and version2:
            top.set("trgLang", target)
        elif target:
            for f in top.iter(f"{{{etree.QName(top).namespace}}}file" if etree.QName(top).namespace else "file"):
                f.set("target-language", target)
        out = etree.tostring(document, xml_declaration=True, encoding=encoding)
        if declaration and out.startswith(b"<?xml"):  # the declaration as it was written (quotes, standalone)
            out = declaration + out[out.index(b"?>") + 2:]
        return out
    return Document([u.segment() for u in kept], rebuild)
