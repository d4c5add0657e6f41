"""Office Open XML paragraphs <-> segments: runs and their formatting kept, only the text changed.

One engine for WordprocessingML (w:p of .docx), DrawingML (a:p of .pptx) and SpreadsheetML rich
text (si/is/text of .xlsx): they all hold a paragraph as a sequence of runs, each a run-property
element and its text, between properties kept at the start (w:pPr, a:pPr) and at the end
(a:endParaRPr, x:rPh). A `Dialect` names those elements.

A paragraph becomes one segment (server/files/markup.py): the text of the runs that carry the
paragraph's usual formatting (the formatting of most of its characters) is plain text, every run of
other formatting is a group `<gN>…</gN>`, a container (a hyperlink, an insertion) is a group whose
inside is read the same way, and everything else (an image, a tab, a break, a field, a bookmark, a
proofing mark, a footnote reference) is an atom `<xN/>` that comes back in its place. Adjacent runs
of the same formatting are read as one (Word splits runs for revision ids alone).

Putting a translation back: text outside any group becomes a run with the usual formatting (a
copy of such a run's properties), a group's text a run with that group's run's properties, and
atoms and containers are the original elements moved into place (never copied: a text box's
own paragraphs, translated as segments of their own, live inside them). A run that mixes text
with non-text children (a tab between two words) is cut into runs of one kind each.
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from lxml import etree

from server.files.markup import Atom, Builder, Node, ids, parse

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
MAX_DEPTH = 16  # containers inside containers; deeper ones stay as they are (atoms)


@dataclass(frozen=True)
class Dialect:
    run: str
    text: str
    props: str
    first: frozenset  # children kept at the start, in place
    last: frozenset  # children kept at the end, in place
    containers: frozenset  # children whose own runs are read as part of the paragraph
    preserve_space: bool  # mark text with leading/trailing spaces xml:space="preserve"


def _key(props: Optional[etree._Element]) -> bytes:
    return etree.tostring(props) if props is not None else b""


class Paragraph:
    """One paragraph's segment and, given its translation, its runs rebuilt in place."""

    def __init__(self, element: etree._Element, dialect: Dialect, newline: str = "br"):
        self.element, self.d = element, dialect
        self.table: dict[int, tuple] = {}
        self.builder = Builder(newline)
        self.base = self._read(element, self.builder, 0)

    # -- reading ------------------------------------------------------------------------
    def _items(self, container: etree._Element, depth: int) -> list[tuple]:
        """("text", run, text, key) | ("atom", element) | ("split", run, child) | ("box", element)."""
        d, items = self.d, []
        for child in container:
            if child.tag in d.first or child.tag in d.last:
                continue
            if child.tag == d.run:
                props = child.find(d.props)
                body = [c for c in child if c.tag != d.props]
                if body and all(c.tag == d.text for c in body):
                    items.append(("text", child, "".join(c.text or "" for c in body), _key(props)))
                elif not any(c.tag == d.text for c in body):
                    items.append(("atom", child))
                else:  # text and other pieces in one run: each piece on its own
                    for c in body:
                        if c.tag == d.text:
                            items.append(("text", child, c.text or "", _key(props)))
                        else:
                            items.append(("split", child, c))
            elif child.tag in d.containers and depth < MAX_DEPTH:
                items.append(("box", child))
            else:
                items.append(("atom", child))
        return items

    def _read(self, container: etree._Element, out: Builder, depth: int) -> Optional[etree._Element]:
        """Writes the container's markup; returns the run whose formatting is its usual one (None: no text)."""
        items = self._items(container, depth)
        weight: Counter = Counter()
        template: dict[bytes, etree._Element] = {}
        for item in items:
            if item[0] == "text":
                weight[item[3]] += len(item[2])
                template.setdefault(item[3], item[1])
        base_key = weight.most_common(1)[0][0] if weight else None
        open_id: Optional[int] = None  # the group of non-usual formatting being written, and its formatting
        open_key: Optional[bytes] = None
        for item in items:
            kind = item[0]
            if kind == "text" and open_id is not None and item[3] == open_key:
                out.text(item[2])
                continue
            if open_id is not None:
                out.close(open_id)
                open_id = None
            if kind == "text" and item[3] == base_key:
                out.text(item[2])
            elif kind == "text":
                open_id, open_key = self._new(("run", item[1])), item[3]
                out.open(open_id)
                out.text(item[2])
            elif kind == "box":
                ident = self._new(("box", item[1], None))
                out.open(ident)
                inner = self._read(item[1], out, depth + 1)
                self.table[ident] = ("box", item[1], inner)
                out.close(ident)
            else:
                out.atom(self._new(item))
        if open_id is not None:
            out.close(open_id)
        return template.get(base_key) if base_key is not None else None

    def _new(self, entry: tuple) -> int:
        ident = len(self.table)
        self.table[ident] = entry
        return ident

    def segment(self) -> Optional[str]:
        """The markup to translate, or None when the paragraph has no text worth it."""
        return self.builder.markup() if self.builder.has_text() else None

    # -- writing ------------------------------------------------------------------------
    def put(self, translation: str) -> None:
        nodes = parse(translation)
        groups, atoms = ids(nodes)
        lost = [i for i, e in self.table.items() if e[0] in ("atom", "split", "box") and i not in atoms | groups]
        nodes += [Atom(i) for i in lost]  # never expected (the planner returns every tag); nothing is lost
        self._write(self.element, nodes, self.base, 0)

    def _write(self, container: etree._Element, nodes: list[Node], base, depth: int) -> None:
        d = self.d
        keep_last = [c for c in container if c.tag in d.last]
        for child in list(container):
            if child.tag not in d.first:  # the leading properties stay where they are
                container.remove(child)
        self._emit(container, nodes, base, depth)
        for c in keep_last:
            container.append(c)

    def _emit(self, container: etree._Element, nodes: list[Node], template, depth: int) -> None:
        for node in nodes:
            if isinstance(node, str):
                if node:
                    self._run(container, template, node)
            elif isinstance(node, Atom):
                self._atom(container, node.id)
            elif node.id in self.table and self.table[node.id][0] == "run":
                self._emit(container, node.children, self.table[node.id][1], depth)
            elif node.id in self.table and self.table[node.id][0] == "box":
                _, element, inner = self.table[node.id]
                container.append(element)
                self._write(element, node.children, inner if inner is not None else template, depth + 1)
            else:  # an id this paragraph never wrote: keep its text
                self._emit(container, node.children, template, depth)

    def _atom(self, container: etree._Element, ident: int) -> None:
        entry = self.table.get(ident)
        if entry is None:
            return
        if entry[0] == "atom":
            container.append(entry[1])
        elif entry[0] == "split":
            run = etree.SubElement(container, entry[1].tag, dict(entry[1].attrib))
            props = entry[1].find(self.d.props)
            if props is not None:
                run.append(copy.deepcopy(props))
            run.append(entry[2])

    def _run(self, container: etree._Element, template, text: str) -> None:
        d = self.d
        run = etree.SubElement(container, d.run, dict(template.attrib) if template is not None else {})
        props = template.find(d.props) if template is not None else None
        if props is not None:
            run.append(copy.deepcopy(props))
        t = etree.SubElement(run, d.text)
        t.text = text
        if d.preserve_space and text != text.strip():
            t.set(XML_SPACE, "preserve")


def paragraphs(root: etree._Element, tag: str, dialect: Dialect, newline: str = "br") -> list[Paragraph]:
    """Every paragraph under `root` (text boxes' own included), read before any is changed."""
    return [Paragraph(p, dialect, newline) for p in list(root.iter(tag))]
